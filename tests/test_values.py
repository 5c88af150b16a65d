"""gatt.data.values: a constraint's value found and replaced in a reply as whole words, in the case it is written."""

from gatt.data.values import forms, shows, substitute


def test_a_value_shows_only_as_whole_words_in_any_of_its_cases():
    assert forms("ice cream") == {"Ice Cream": "title", "ICE CREAM": "upper", "ice cream": ""}
    assert shows("I love ICE CREAM!", "ice cream") and shows("Ice Cream, always.", "ice cream")
    assert not shows("Whales sing.", "Whale") and not shows("a bluewhale", "whale")
    assert shows("(Whale)", "Whale") and not shows("iCE cream", "ice cream")


def test_a_substitute_keeps_each_form_and_touches_nothing_else():
    assert substitute("Whale! a whale, A WHALE. Whales.", "whale", "dolphin") == (
        "Dolphin! a dolphin, A DOLPHIN. Whales."
    )
    assert substitute("Code: KX47.", "KX47", "AB12") == "Code: AB12."  # as written wins over its upper form
    assert substitute("No value here.", "tea", "coffee") == "No value here."
    assert substitute(r"Pay \1 in tea", "tea", r"\1 mate") == r"Pay \1 in \1 mate"  # the value itself, no template
