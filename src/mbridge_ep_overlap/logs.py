"""Log verifier (``mbridge-ep-overlap verify-log``): placeholder until the evidence issue lands."""


def add_parser(sub) -> None:
    return None
