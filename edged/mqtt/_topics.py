"""Topic names, filters and templates. Pure functions; every problem is a PayloadError naming the topic."""

from __future__ import annotations

import functools
import re

from edged.errors import PayloadError

_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_VERSION = re.compile(r"[0-9]{1,18}")
_PLACEHOLDER = re.compile(r"\{(\d+)\}")
MAX_TOPIC_BYTES = 65535
SHARE_PREFIX = "$share/"


def subscription_filter(subscription: str) -> str:
    """The topic filter that a subscription's messages match: for a shared subscription
    ``$share/{group}/{filter}`` (MQTT v5; mosquitto offers it to 3.1.1 clients too) the messages come under
    their own topics, which match ``filter``; any other subscription is its own filter."""
    if not subscription.startswith(SHARE_PREFIX):
        return subscription
    group, slash, rest = subscription[len(SHARE_PREFIX):].partition("/")
    if not group or not slash or not rest or "+" in group or "#" in group:
        raise PayloadError(f"shared subscription {subscription!r}: expected $share/<group>/<filter>, the group a "
                           "name without '+', '#' or '/'")
    return rest


def filter_matches(topic_filter: str, topic: str) -> tuple[str, ...] | None:
    """The segments the filter's wildcards matched (``#`` gives the rest joined by '/'), or None."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return None  # MQTT 4.7.2: wildcards at the first level never match $-topics
    wanted = topic_filter.split("/")
    parts = topic.split("/")
    captures: list[str] = []
    for index, level in enumerate(wanted):
        if level == "#":
            captures.append("/".join(parts[index:]))
            return tuple(captures)
        if index >= len(parts):
            return None
        if level == "+":
            captures.append(parts[index])
        elif level != parts[index]:
            return None
    return tuple(captures) if len(parts) == len(wanted) else None


def check_filter(topic_filter: str) -> None:
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if ("#" in level and (level != "#" or index != len(levels) - 1)) or ("+" in level and level != "+"):
            raise PayloadError(f"topic filter {topic_filter!r}: '+' and '#' must fill a whole level, '#' only "
                               "the last")
    if not topic_filter or "\0" in topic_filter:
        raise PayloadError(f"topic filter {topic_filter!r} is empty or holds NUL")


def wildcard_count(topic_filter: str) -> int:
    return sum(1 for level in topic_filter.split("/") if level in ("+", "#"))


def check_template(template: str, wildcards: int) -> None:
    for match in _PLACEHOLDER.finditer(template):
        number = int(match.group(1))
        if not 1 <= number <= wildcards:
            raise PayloadError(f"output template {template!r}: {{{number}}} but the input filter has "
                               f"{wildcards} wildcards")
    check_topic_name(_PLACEHOLDER.sub("x", template))


def template_may_match(template: str, input_filter: str, topic_filter: str) -> bool:
    """Whether some topic ``template`` renders (its placeholders filled from what ``input_filter`` matched) can
    match ``topic_filter``: a placeholder of a ``+`` fills one level with anything, one of a ``#`` one level or
    more. Conservative: a level mixing text and a ``#`` placeholder counts as any levels."""
    kinds = [level for level in input_filter.split("/") if level in ("+", "#")]
    levels: list[str | re.Pattern[str] | None] = []  # text, one level (a pattern), None: one level or more
    for level in template.split("/"):
        numbers = [int(m.group(1)) for m in _PLACEHOLDER.finditer(level)]
        if any(kinds[n - 1] == "#" for n in numbers if 1 <= n <= len(kinds)):
            levels.append(None)
        elif numbers:
            parts = _PLACEHOLDER.split(level)  # text, number, text, ...
            levels.append(re.compile("".join(re.escape(p) if i % 2 == 0 else "[^/]*" for i, p in enumerate(parts))))
        else:
            levels.append(level)
    return _overlap(levels, topic_filter.split("/"))


def filters_overlap(first: str, second: str) -> bool:
    """Whether some topic matches both filters (conservative as `template_may_match`)."""
    levels: list[str | re.Pattern[str] | None] = [
        None if level == "#" else _ANY_LEVEL if level == "+" else level for level in first.split("/")]
    if levels and levels[-1] is None and _overlap(levels[:-1], second.split("/")):
        return True  # a trailing "#" also matches its parent level
    return _overlap(levels, second.split("/"))


_ANY_LEVEL = re.compile("[^/]*")


def _overlap(levels: list[str | re.Pattern[str] | None], wanted: list[str]) -> bool:
    """Whether the template ``levels`` can match the filter ``wanted``: one search over (level, filter level)
    pairs, each decided once. Trying every split afresh was exponential: a template with twelve "#"
    placeholders against a filter of sixty levels kept `edged serve` from starting for good."""

    @functools.cache
    def match(i: int, j: int) -> bool:
        if j < len(wanted) and wanted[j] == "#":
            return True  # the rest, zero levels included
        if i == len(levels) or j == len(wanted):
            return i == len(levels) and j == len(wanted)
        head = levels[i]
        if head is None:  # one level or more: try each length
            return any(match(i + 1, k) for k in range(j + 1, len(wanted) + 1))
        if wanted[j] == "+":
            return match(i + 1, j + 1)
        text_matches = head == wanted[j] if isinstance(head, str) else head.fullmatch(wanted[j]) is not None
        return text_matches and match(i + 1, j + 1)

    return match(0, 0)


def render(template: str, captures: tuple[str, ...]) -> str:
    topic = _PLACEHOLDER.sub(lambda m: captures[int(m.group(1)) - 1], template)
    check_topic_name(topic)
    return topic


# Characters MQTT 1.5.4 says a string should not hold and lets a receiver close the connection for (mosquitto
# does, "malformed packet"): control characters, surrogates and noncharacters. A reply topic from a JSON
# "reply_to" can hold any of them; published, the broker would drop edged's connection on every resend.
_REFUSED_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\ufdd0-\ufdef\ufffe\uffff"
                                 + "".join(f"{chr(plane << 16 | 0xFFFE)}{chr(plane << 16 | 0xFFFF)}"
                                           for plane in range(1, 17)) + "]")


def check_topic_name(topic: str) -> str:
    """A topic edged may publish to: non-empty, no wildcards, no control characters (NUL included), surrogates
    or noncharacters, not a $-topic, within MQTT's length."""
    if not topic or "+" in topic or "#" in topic or topic.startswith("$"):
        raise PayloadError(f"topic {topic[:200]!r} is not a valid topic to publish to (empty, wildcard or "
                           "$-topic)")
    bad = _REFUSED_CHARACTERS.search(topic)
    if bad is not None:
        raise PayloadError(f"topic {topic[:200]!r} holds {bad.group()!r}, a control character or noncharacter, "
                           "which brokers refuse (mosquitto closes the connection); use printable characters")
    if len(topic.encode("utf-8", "surrogatepass")) > MAX_TOPIC_BYTES:
        raise PayloadError(f"topic is {len(topic)} characters, more than MQTT's {MAX_TOPIC_BYTES} bytes")
    return topic


def check_reply_topic(topic: str, prefix: str, input_filters: tuple[str, ...]) -> str:
    """A topic a requester may have its reply published to: publishable, not under edged's own ``prefix`` (its
    status, requests, chat, telemetry, OTA and command topics: a reply there would be a confused deputy, e.g. a
    result read as the device's status) and not one of the pipelines' inputs (the reply would be taken as one)."""
    check_topic_name(topic)
    if topic == prefix or topic.startswith(prefix + "/"):
        raise PayloadError(f"reply topic {topic[:200]!r} is under edged's own topics {prefix}/ (status, infer, "
                           "chat, telemetry, ota, commands); reply to a topic of your own")
    for topic_filter in input_filters:
        if filter_matches(topic_filter, topic) is not None:
            raise PayloadError(f"reply topic {topic[:200]!r} matches the pipeline input {topic_filter!r}: the reply "
                               "would be taken as an input; reply to a topic of your own")
    return topic


def parse_infer_topic(prefix: str, topic: str) -> tuple[str, str] | None:
    """(model, version) from ``{prefix}/infer/{model}[/{version}]``; None when the topic is not an infer topic."""
    head = f"{prefix}/infer/"
    if not topic.startswith(head):
        return None
    rest = topic[len(head):].split("/")
    if len(rest) > 2 or not _MODEL_NAME.fullmatch(rest[0]) or rest[0] in (".", ".."):
        raise PayloadError(f"infer topic {topic[:200]!r}: expected {prefix}/infer/<model>[/<version>] with a "
                           "model name of letters, digits, '_', '.', '-'")
    version = rest[1] if len(rest) == 2 else ""
    if version and not _VERSION.fullmatch(version):
        raise PayloadError(f"infer topic {topic[:200]!r}: version must be a number, found {version[:50]!r}")
    return rest[0], version
