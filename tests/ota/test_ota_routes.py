"""The daemon's OTA routes: reads are open, check and rollback need the admin permission."""

from __future__ import annotations

from edged.serving._routes import SPECS, Kind, match


def test_ota_actions_need_admin_and_reads_are_open() -> None:
    for action, kind, method, permission in (("status", Kind.DAEMON_READ, b"GET", "open"),
                                             ("history", Kind.DAEMON_READ, b"GET", "open"),
                                             ("check", Kind.DAEMON_ACTION, b"POST", "admin"),
                                             ("rollback", Kind.DAEMON_ACTION, b"POST", "admin")):
        route = match(f"/v2/edged/ota/{action}".encode())
        assert route is not None and route.kind is kind and route.model == f"ota/{action}"
        assert (SPECS[kind].method, SPECS[kind].permission) == (method, permission)
    assert match(b"/v2/edged/ota/delete-everything") is None
