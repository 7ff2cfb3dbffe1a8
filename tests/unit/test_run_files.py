"""The evidence file names and the patterns readers match them with come from one module and agree."""

from mbridge_ep_overlap.base import run_files as r


def test_each_name_matches_its_pattern_with_the_rank():
    for make, pattern in ((r.facts_file, r.FACTS_NAME), (r.watchdog_file, r.WATCHDOG_NAME),
                          (r.faulthandler_file, r.FAULTHANDLER_NAME)):
        assert pattern.match(make("run", 7).name).group(1) == "7"
        assert not pattern.match(make("run", 7).name + ".bak")
