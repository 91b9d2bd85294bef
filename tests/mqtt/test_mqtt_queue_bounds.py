"""The pipeline hand-off queue's bounds: a ``block`` queue takes QoS 1/2 inputs past its capacity (so paho's
network thread keeps reading the PUBACKs a full outbox waits for), but only up to ``FLOW_LIMIT`` items and
``FLOW_LIMIT_BYTES`` of payload: a broker that ignores Receive Maximum cannot make it hold gigabytes of frames."""

from __future__ import annotations

import threading
import time

from edged.mqtt._queue import FLOW_LIMIT_BYTES, BoundedQueue

FRAME = 6_220_800  # a 1080p RGB frame


def _wait_until(condition: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_flow_controlled_inputs_past_the_capacity_are_bounded_by_their_bytes() -> None:
    queue: BoundedQueue[int] = BoundedQueue(2, "block")
    fits = FLOW_LIMIT_BYTES // FRAME  # frames the overflow may hold, the capacity's included
    for index in range(fits):
        assert queue.put(index, flow_controlled=True, size=FRAME) is None  # none of these waits
    assert len(queue) == fits > 2
    producer = threading.Thread(target=queue.put, args=(fits,), kwargs={"flow_controlled": True, "size": FRAME})
    producer.start()
    try:
        assert _wait_until(queue.producer_waits), "the frame past FLOW_LIMIT_BYTES must wait for room"
        assert len(queue) == fits
        assert queue.take(1) == [0]  # room: the waiting producer goes on
        assert _wait_until(lambda: len(queue) == fits)
    finally:
        queue.close()
        producer.join(5)
    assert not producer.is_alive()


def test_small_flow_controlled_inputs_still_queue_far_past_the_capacity() -> None:
    queue: BoundedQueue[int] = BoundedQueue(2, "block")
    for index in range(500):  # PUBACK-sized payloads: the count limit, not the bytes, is what bounds them
        assert queue.put(index, flow_controlled=True, size=100) is None
    assert len(queue) == 500
    assert queue.take(600) == list(range(500))
    assert len(queue) == 0


def test_a_request_queue_holds_flow_controlled_requests_within_the_same_bounds() -> None:
    queue: BoundedQueue[int] = BoundedQueue(2, "drop_oldest", hold_flow_controlled=True)
    for index in range(500):  # QoS 1 requests: held past the capacity, none refused
        assert queue.put(index, flow_controlled=True, size=100) is None
    assert queue.put(500) == 0  # a QoS 0 request past the capacity still drops the oldest
    assert len(queue.take(1000)) == 500
    fits = FLOW_LIMIT_BYTES // FRAME
    for index in range(fits):
        assert queue.put(index, flow_controlled=True, size=FRAME) is None
    assert queue.put(fits, flow_controlled=True, size=FRAME) == 0  # past the bytes: the oldest is dropped
    assert len(queue) == fits
