"""Just enough of PromQL to say which series an expression reads.

`selectors(expr)` returns every vector selector (metric name and label matchers)
and every label named in `by`/`without`/`on`/`ignoring`/`group_*` clauses. It
tokenizes rather than fully parses: range and subquery brackets are skipped,
strings and Grafana variables ($level, $__rate_interval) are tokens, and an
identifier is a metric unless it opens a call, is a keyword, or sits in a
label list. Anything it cannot tokenize raises, so a query it does not
understand fails the test instead of passing unread.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

FUNCTIONS = frozenset(
    [
        "abs",
        "absent",
        "absent_over_time",
        "avg",
        "avg_over_time",
        "bottomk",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count",
        "count_over_time",
        "delta",
        "deriv",
        "exp",
        "floor",
        "group",
        "histogram_quantile",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "max",
        "max_over_time",
        "min",
        "min_over_time",
        "quantile",
        "quantile_over_time",
        "rate",
        "resets",
        "round",
        "scalar",
        "sort",
        "sort_desc",
        "stddev",
        "sum",
        "sum_over_time",
        "time",
        "timestamp",
        "topk",
        "vector",
    ]
)
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
OPERATORS = frozenset({"and", "or", "unless", "bool", "offset"})

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<variable>\$\{?\w+\}?)
  | (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<match>=~|!~|!=|==|<=|>=|=)
  | (?P<punct>[(){}\[\],*/+\-^%<>@:])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)


@dataclass
class Reads:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)  # labels of by/without/on/... clauses


def tokens(expr: str) -> list[tuple[str, str]]:
    out, position = [], 0
    while position < len(expr):
        found = _TOKEN.match(expr, position)
        if not found:
            raise ValueError(f"cannot tokenize {expr[position:]!r} in {expr!r}")
        position = found.end()
        kind = found.lastgroup or ""
        if kind != "space":
            out.append((kind, found.group()))
    return out


def selectors(expr: str) -> Reads:
    toks = tokens(expr)
    reads = Reads()
    i = 0

    def peek(at: int) -> str:
        return toks[at][1] if at < len(toks) else ""

    while i < len(toks):
        kind, text = toks[i]
        if text == "[":  # a range or subquery: durations and variables, no series
            i = toks.index(("punct", "]"), i) + 1
            continue
        if kind == "name" and text in GROUPING and peek(i + 1) == "(":
            close = toks.index(("punct", ")"), i)
            reads.grouping.update(t for k, t in toks[i + 2 : close] if k == "name")
            i = close + 1
            continue
        if kind == "name" and peek(i + 1) == "(":
            if text not in FUNCTIONS:
                raise ValueError(f"unknown function {text!r} in {expr!r}")
            i += 1
            continue
        if kind == "name" and text in FUNCTIONS and peek(i + 1) in GROUPING:
            i += 1  # `sum by (...) (...)`: the clause comes next
            continue
        if kind == "name" and text not in OPERATORS:
            matchers, i = _matchers(toks, i + 1, expr)
            reads.selectors.append(Selector(text, matchers))
            continue
        if text == "{":
            raise ValueError(f"a selector without a metric name in {expr!r}")
        i += 1
    return reads


def _matchers(
    toks: list[tuple[str, str]], i: int, expr: str
) -> tuple[tuple[tuple[str, str, str], ...], int]:
    if i >= len(toks) or toks[i][1] != "{":
        return (), i
    found = []
    i += 1
    while toks[i][1] != "}":
        label, op, value = toks[i : i + 3]
        if label[0] != "name" or op[0] != "match" or value[0] != "string":
            raise ValueError(f"bad label matcher {label, op, value} in {expr!r}")
        found.append((label[1], op[1], value[1][1:-1]))
        i += 3
        if toks[i][1] == ",":
            i += 1
    return tuple(found), i + 1


# Series Prometheus makes itself, and labels it puts on every scraped series
# (a ServiceMonitor's target labels): a query may name them though no operator serves them.
PROMETHEUS_SERIES = frozenset({"up"})
TARGET_LABELS = frozenset(
    {"job", "namespace", "instance", "pod", "service", "endpoint", "container"}
)


def chart_queries(manifests: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(where, expr) of every dashboard panel and template query and every alert rule."""
    found = []
    for doc in manifests:
        if doc["kind"] == "PrometheusRule":
            for group in doc["spec"]["groups"]:
                found += [(f"alert {r['alert']}", r["expr"]) for r in group["rules"]]
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-dashboard"):
            for name, text in doc["data"].items():
                board = json.loads(text)
                for panel in board["panels"]:
                    found += [(f"{name}: {panel['title']}", t["expr"]) for t in panel["targets"]]
                for var in board["templating"]["list"]:
                    query = var.get("query")
                    if isinstance(query, dict):  # label_values(metric, label)
                        match = _LABEL_VALUES.fullmatch(query["query"])
                        if match is None:
                            raise ValueError(f"unread variable query {query['query']!r}")
                        metric, label = match.groups()
                        found.append((f"{name}: ${var['name']}", f"group by ({label}) ({metric})"))
    return found


_LABEL_VALUES = re.compile(r"label_values\((\w+),\s*(\w+)\)")


def problems(expr: str, exposition: str) -> list[str]:
    """What `expr` reads that `exposition` (the text of /metrics) does not serve: metric
    names (full sample names: _bucket, _count, _total included), matcher labels, literal
    values of `=` matchers, and grouping labels."""
    served: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            served.setdefault(sample.name, []).append(dict(sample.labels))
    reads = selectors(expr)
    found, known = [], set(TARGET_LABELS)
    for sel in reads.selectors:
        if sel.metric in PROMETHEUS_SERIES:
            labels = [dict.fromkeys(TARGET_LABELS, "")]
        elif sel.metric not in served:
            found.append(f"metric {sel.metric} is not served")
            continue
        else:
            labels = served[sel.metric]
        names = set().union(*labels) | TARGET_LABELS
        known |= names
        for label, op, value in sel.matchers:
            if label not in names:
                found.append(f"{sel.metric} has no label {label}")
            elif label in TARGET_LABELS or sel.metric in PROMETHEUS_SERIES:
                continue  # set by Prometheus when it scrapes, not by the operator
            elif op == "=" and "$" not in value and all(s.get(label) != value for s in labels):
                found.append(f"{sel.metric} has no series with {label}={value!r}")
    found += [f"grouping label {label} is on no series read" for label in reads.grouping - known]
    return found
