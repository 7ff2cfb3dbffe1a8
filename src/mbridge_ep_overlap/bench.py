"""Benchmark harness (``mbridge-ep-overlap bench``): placeholder until the evidence issue lands."""


def add_parser(sub) -> None:
    return None
