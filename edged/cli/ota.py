"""``edged ota``: the running daemon's model updates — status, history, check now, roll back.

Talks to the daemon's ``/v2/edged/ota/...`` routes; check and rollback need the admin permission.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from edged.cli._socket import add_client_options, client_from

ACTIONS = {"status": "the update state, download progress, skipped targets and why",
           "history": "finished updates (active, refused, rolled back) and the targets remembered as bad",
           "check": "check the repository now and install what is due (waits for the result)",
           "rollback": "go back to the version served before the last update",
           "selftest": "every served model answers its test vectors or warm-up (what a new release must pass)"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("ota", help="the daemon's updates: status, history, check, rollback, selftest",
                                   description="This device's model and daemon release updates from the fleet's "
                                   "signed repository ([ota]).")
    actions = parser.add_subparsers(dest="ota_action", metavar="ACTION", required=True)
    for name, summary in ACTIONS.items():
        action = actions.add_parser(name, help=summary, description=summary)
        action.add_argument("--json", action="store_true", help="print the daemon's JSON document")
        add_client_options(action)
        if name == "check":
            action.set_defaults(timeout=600.0)  # a check downloads and tests a model before answering
        action.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with client_from(args) as client:
        doc = client.ota(args.ota_action)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.ota_action == "history":
        print("\n".join(_history(doc)) or "no updates yet")
    elif args.ota_action == "selftest":
        print("\n".join(f"{model}: {result}" for model, result in sorted(doc.get("models", {}).items()))
              or "no model is served")
        return 0 if doc.get("ok") else 1
    else:
        print("\n".join(describe(doc)))
    refused = (doc.get("last_check") or {}).get("outcome") == "refused"
    return 1 if args.ota_action == "check" and refused else 0


def describe(doc: dict[str, Any]) -> list[str]:
    lines = [f"device    {doc.get('device_id')} ({doc.get('device_id_source')})",
             f"state     {doc.get('state')}" + (f": {doc['reason']}" if doc.get("reason") else "")]
    if doc.get("target"):
        lines.append(f"target    {doc['target']} (model {doc.get('model')} {doc.get('previous_version')} → "
                     f"{doc.get('version')})")
    download = doc.get("download") or {}
    if download.get("total_bytes"):
        lines.append(f"download  {download['received_bytes']}/{download['total_bytes']} bytes "
                     f"(resumed from {download.get('resumed_from', 0)})")
    check = doc.get("last_check") or {}
    if check:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(check.get("at", 0)))
        lines.append(f"checked   {when}: {check.get('outcome')}" + (f": {check['reason']}" if check.get("reason")
                                                                    else ""))
    lines += [f"skipped   {name}: {why}" for name, why in sorted((doc.get("skipped") or {}).items())]
    release = doc.get("release") or {}
    if release:
        lines.append(f"release   {release.get('running')}: {release.get('state')}"
                     + (f" {release['version']}" if release.get("version") else "")
                     + (f": {release['reason']}" if release.get("reason") else ""))
        lines += [f"skipped   {name}: {why}" for name, why in sorted((release.get("skipped") or {}).items())]
    return lines


def _history(doc: dict[str, Any]) -> list[str]:
    lines = []
    for entry in doc.get("history", []):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.get("changed_at", 0)))
        lines.append(f"{when}  {entry.get('target')}  {entry.get('state')}  {entry.get('reason', '')}")
    return lines
