"""What a solve says about each character: a bit set, and plain words for it."""

OK = 0
HELD_BAD_TARGETS = 1          # non-finite, degenerate or absurd targets: the last good pose was kept
HELD_BAD_OUTPUT = 2           # the network or refinement produced non-finite numbers: the last good pose was kept
MISSED = 4                    # refined, but an effector is more than `tolerance` from its target (out of reach)
STATUS_TEXT = {OK: "ok", HELD_BAD_TARGETS: "targets are not usable (non-finite, degenerate or absurdly far): "
               "holding the last good pose", HELD_BAD_OUTPUT: "the solve gave non-finite numbers: holding the last good pose",
               MISSED: "a target is out of reach"}
HELD = HELD_BAD_TARGETS | HELD_BAD_OUTPUT   # either way the character kept its last good pose


def describe(status):
    """Plain words for a status bit set."""
    words = [text for bit, text in STATUS_TEXT.items() if bit and status & bit]
    return "; ".join(words) if words else "ok"
