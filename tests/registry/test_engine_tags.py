"""What ``pair engine --url`` stores (registry.pairs.engine_tags): never a credential. The second walk-through
(issue 43) found the user info dropped but a token in the URL's query stored and printed."""

from __future__ import annotations

import pytest

from registry.pairs import engine_tags


def test_user_info_and_query_are_not_stored_and_each_is_said():
    tags, dropped = engine_tags("http://bob:hunter2secret@127.0.0.1:18931/?token=abc#frag", None)
    assert tags["engine_url"] == "http://127.0.0.1:18931/"
    assert "hunter2secret" not in str(tags) and "abc" not in str(tags)
    assert len(dropped) == 2 and "user info" in dropped[0] and "query" in dropped[1]


def test_a_plain_url_is_stored_as_given():
    tags, dropped = engine_tags("http://127.0.0.1:8080", ["llama-server", "-m", "t.gguf"], concurrency=2)
    assert tags == {"engine_url": "http://127.0.0.1:8080", "engine_concurrency": "2",
                    "engine_flags": '["llama-server", "-m", "t.gguf"]'} and dropped == []


@pytest.mark.parametrize("url", ["", "notaurl", "ftp://h:1"])
def test_not_an_engine_url_is_refused_naming_it(url):
    with pytest.raises(ValueError, match="base URL, got"):
        engine_tags(url, None)
