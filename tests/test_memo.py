"""The memo on disk: computed once per key, recomputed where an entry is damaged, never an error
where the folder cannot be written; the import scan it keeps follows the source text."""

import json

import pytest

from sslbench import memo, provenance


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(memo.FOLDER_VARIABLE, str(tmp_path / "cache"))
    return tmp_path / "cache"


def counting(value):
    calls = []

    def compute():
        calls.append(1)
        return value

    return compute, calls


def test_a_key_is_computed_once_and_read_back_after(cache):
    compute, calls = counting({"a": [1, 2]})
    assert memo.remembered("kind", "key", compute) == {"a": [1, 2]}
    assert memo.remembered("kind", "key", compute) == {"a": [1, 2]}
    assert len(calls) == 1
    other, other_calls = counting(3)
    assert memo.remembered("kind", "another key", other) == 3  # another key, another entry
    assert memo.remembered("another kind", "key", other) == 3
    assert len(other_calls) == 2


def test_a_damaged_entry_is_computed_again_and_rewritten(cache):
    compute, calls = counting([1])
    memo.remembered("kind", "key", compute)
    (entry,) = (cache / "kind").iterdir()
    entry.write_text('{"trunc')
    assert memo.remembered("kind", "key", compute) == [1]
    assert len(calls) == 2
    assert json.loads(entry.read_text()) == [1]


def test_a_folder_that_cannot_be_written_only_costs_the_time(tmp_path, monkeypatch):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv(memo.FOLDER_VARIABLE, str(blocker / "cache"))  # under a file: no folder there
    compute, calls = counting("value")
    assert memo.remembered("kind", "key", compute) == "value"
    assert memo.remembered("kind", "key", compute) == "value"
    assert len(calls) == 2


def test_the_import_scan_follows_the_text_of_the_file(cache, tmp_path):
    source = tmp_path / "module.py"
    source.write_text("import os\nfrom sslbench import atomic\n\ndef f():\n    from . import errors\n")
    for _ in range(2):  # computed, then read back: the same
        assert provenance.import_statements(source, "sslbench") == [
            ["sslbench", ["atomic"]],
            ["sslbench", ["errors"]],
        ]
    assert len(list((cache / "imports").iterdir())) == 1
    source.write_text("import sslbench.knn\n")  # an edit: a new key, never the old entry
    assert provenance.import_statements(source, "sslbench") == [["sslbench.knn", []]]
