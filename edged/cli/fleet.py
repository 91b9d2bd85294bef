"""``edged fleet``: the operator's TUF repository of model bundles and daemon releases (init, add-model,
add-release, promote, refresh, targets)
and the fleet's reported OTA status (status).

Runs on the operator's workstation, never on a device. The repository is static files: serve ``REPO`` (its
``metadata/`` and ``targets/``) from any web server, CDN or object store; the keys are in ``REPO.keys/``
beside it, and ``REPO.keys/root-*.pem`` belong offline once initialised.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edged.errors import ConfigError, UpdateRejected


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("fleet", help="the operator's signed update repository (TUF)",
                                   description="Create and sign the TUF repository devices update from.")
    commands = parser.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
    init = commands.add_parser("init", help="create keys and metadata for a new repository")
    init.add_argument("repo", type=Path)
    init.add_argument("--threshold", type=int, default=1, help="root keys needed to sign a new root (default 1)")
    init.set_defaults(handler=_init)
    add = commands.add_parser("add-model", help="bundle a model version with its test vectors and sign it")
    add.add_argument("repo", type=Path)
    add.add_argument("model_dir", type=Path, help="the model folder (config.pbtxt and numbered versions)")
    add.add_argument("--version", type=int, required=True, help="the version folder to bundle")
    add.add_argument("--test-vectors", type=Path, default=None,
                     help="test_vectors.json (default: MODEL_DIR/VERSION/test_vectors.json)")
    add.add_argument("--percent", type=int, default=100, help="the first wave's share of the fleet (default 100)")
    add.add_argument("--compat", action="append", default=[], metavar="KEY=VALUE",
                     help="module, jetpack, l4t, tensorrt (X, >=X or X-Y) or min_edged_version; repeatable")
    add.add_argument("--cohort-salt", default=None, metavar="SALT",
                     help="targets with the same salt reach the same devices first (a stable canary group); "
                     "default: a random salt per target")
    add.add_argument("--build-spec", type=Path, default=None, metavar="FILE",
                     help="build_spec.json for a TensorRT model shipped as ONNX: each device builds its engine "
                     "while staging (keys: onnx, precision, shapes, workspace_mb, calibration_cache)")
    add.set_defaults(handler=_add_model)
    release = commands.add_parser("add-release", help="sign a daemon release (a build-tarball tarball)")
    release.add_argument("repo", type=Path)
    release.add_argument("tarball", type=Path, help="edged-<version>-<platform>.tar.gz from packaging/build-tarball")
    release.add_argument("--percent", type=int, default=100, help="the first wave's share of the fleet (default 100)")
    release.add_argument("--compat", action="append", default=[], metavar="KEY=VALUE",
                         help="module, jetpack, l4t, tensorrt (X, >=X or X-Y) or min_edged_version; repeatable")
    release.set_defaults(handler=_add_release)
    promote = commands.add_parser("promote", help="widen a target's rollout to PERCENT of the fleet")
    promote.add_argument("repo", type=Path)
    promote.add_argument("target", help="the target name add-model printed (models/<model>/<version>.tar)")
    promote.add_argument("--percent", type=int, required=True)
    promote.add_argument("--max-failures", type=int, default=0,
                         help="refuse when more devices than this reported the target refused or rolled back")
    promote.add_argument("--broker", default=None, metavar="URL",
                         help="count the failures from the devices' retained OTA status on this broker")
    promote.add_argument("--failures", type=int, default=None,
                         help="how many devices reported a failure for this target, when no broker is given; "
                         "with neither, promote refuses unless --force")
    promote.add_argument("--force", action="store_true", help="promote without a failure count")
    promote.set_defaults(handler=_promote)
    refresh = commands.add_parser("refresh", help="re-sign snapshot and timestamp (run before they expire)")
    refresh.add_argument("repo", type=Path)
    refresh.set_defaults(handler=_refresh)
    status = commands.add_parser("status", help="every device's retained OTA status from the broker")
    status.add_argument("--broker", required=True, metavar="URL", help="mqtt://host:port or mqtts://host:port")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=_status)
    rotate = commands.add_parser("rotate-key", help="replace a role's key (needs the offline root keys)")
    rotate.add_argument("repo", type=Path)
    rotate.add_argument("role", choices=["root", "targets", "snapshot", "timestamp"])
    rotate.set_defaults(handler=_rotate)
    targets = commands.add_parser("targets", help="list the signed targets and their rollout")
    targets.add_argument("repo", type=Path)
    targets.set_defaults(handler=_targets)


def _repository(path: Path) -> Any:
    from edged.ota.fleet import FleetRepository  # python-tuf is the optional "ota" extra

    return FleetRepository(path)


def _init(args: argparse.Namespace) -> int:
    from edged.ota.fleet import FleetRepository

    result = FleetRepository.init(args.repo, args.threshold)
    print(f"created {args.repo}/metadata and {args.repo}/targets: serve {args.repo} as static files")
    print(f"trusted root for devices: {result.root_file} (install as /etc/edged/ota/root.json)")
    print(f"signing keys: {args.repo}.keys/ (beside the repository: never serve it)")
    for key in result.root_keys:
        print(f"root key: {key}: move it OFFLINE now; it is needed only to rotate keys")
    return 0


def _add_model(args: argparse.Namespace) -> int:
    vectors_path = args.test_vectors or args.model_dir / str(args.version) / "test_vectors.json"
    try:
        vectors = vectors_path.read_bytes()
    except OSError as e:
        raise ConfigError(f"--test-vectors: cannot read {vectors_path}: {e}") from e
    compat = _compat(args.compat)
    build_spec = None
    if args.build_spec is not None:
        try:
            build_spec = args.build_spec.read_bytes()
        except OSError as e:
            raise ConfigError(f"--build-spec: cannot read {args.build_spec}: {e}") from e
    name = _repository(args.repo).add_model(args.model_dir, args.version, vectors, args.percent, compat,
                                            args.cohort_salt, build_spec)
    print(f"added {name} ({args.percent}% of the fleet)")
    return 0


def _add_release(args: argparse.Namespace) -> int:
    if not args.tarball.is_file():
        raise ConfigError(f"add-release: {args.tarball} is not a file (a tarball of packaging/build-tarball)")
    name = _repository(args.repo).add_release(args.tarball, args.percent, _compat(args.compat))
    print(f"added {name} ({args.percent}% of the fleet)")
    return 0


def _compat(items: list[str]) -> dict[str, str]:
    compat = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ConfigError(f"--compat {item!r}: expected KEY=VALUE")
        compat[key] = value
    return compat


def _promote(args: argparse.Namespace) -> int:
    if args.broker is not None:
        from edged.ota.fleet_status import failures, read_fleet

        failed = failures(read_fleet(args.broker), args.target)
        args.failures = len(failed)
        if failed:
            print(f"devices that failed {args.target}: {', '.join(failed)}")
    if args.failures is None and not args.force:
        raise UpdateRejected(f"promote {args.target}: no failure count given; pass --failures N (devices whose "
                             "OTA status is refused or rolled_back for this target) or --force")
    if args.failures is not None and args.failures > args.max_failures and not args.force:
        raise UpdateRejected(f"promote {args.target}: {args.failures} devices failed it, more than "
                             f"--max-failures {args.max_failures}; the rollout stays where it is")
    custom = _repository(args.repo).promote(args.target, args.percent)
    print(f"promoted {args.target} to {custom['percent']}% of the fleet")
    return 0


def _refresh(args: argparse.Namespace) -> int:
    snapshot, timestamp = _repository(args.repo).refresh()
    print(f"signed snapshot version {snapshot} and timestamp version {timestamp}")
    return 0


def _rotate(args: argparse.Namespace) -> int:
    path = _repository(args.repo).rotate_key(args.role)
    print(f"new {args.role} key: {path}; devices pick up the new root at their next check")
    return 0


def _status(args: argparse.Namespace) -> int:
    from edged.ota.fleet_status import read_fleet, table

    fleet = read_fleet(args.broker)
    print(json.dumps(fleet, indent=2, sort_keys=True) if args.json else table(fleet) if fleet else
          "no device has published an OTA status on this broker")
    return 0


def _targets(args: argparse.Namespace) -> int:
    print(json.dumps(_repository(args.repo).targets(), indent=2, sort_keys=True))
    return 0
