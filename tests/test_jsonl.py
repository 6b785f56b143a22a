"""vagent.jsonl.read_records: records with their path:line, blank lines skipped, a bad line raised
as the caller's own error (what the SFT chat reader and the ViGoRL dataset loader report)."""

from __future__ import annotations

import pytest

from vagent.jsonl import read_records
from vagent.recipes.sft import DataError, read_chats
from vagent.vigorl.data import DatasetError, load_dataset


def test_records_carry_their_line_and_blank_lines_are_skipped(tmp_path):
    p = tmp_path / "data.jsonl"
    p.write_text('{"a": 1}\n\n  \n[2, 3]\n')
    assert list(read_records(p, ValueError)) == [({"a": 1}, f"{p}:1"), ([2, 3], f"{p}:4")]


@pytest.mark.parametrize("read, error", [(read_chats, DataError), (load_dataset, DatasetError)])
def test_a_line_that_is_not_json_is_the_readers_own_error_naming_the_line(tmp_path, read, error):
    p = tmp_path / "data.jsonl"
    p.write_text('\n{"messages": \n')
    with pytest.raises(error, match=rf"data\.jsonl:2: not valid JSON \("):
        read(p)
