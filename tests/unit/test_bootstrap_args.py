"""`ecstore cluster bootstrap` refuses bad arguments with exit code 2 and one readable
line, before it waits for any node (no sockets here)."""
from __future__ import annotations

from pathlib import Path

import pytest

from cli.bootstrap import NodeArg, parse_node
from cli.main import main, parser

CONTROL = "c1=http://control1:7100,c2=http://control2:7100,c3=http://control3:7100"
STORAGE = ",".join(f"s{i}=http://storage{i}:7200" for i in range(1, 7))


@pytest.mark.parametrize("text, want", [
    ("s1=http://storage1:7200", NodeArg("s1", "http://storage1:7200")),
    ("s1=http://storage1:7200/", NodeArg("s1", "http://storage1:7200")),
    ("s1=https://10.0.0.5:7200", NodeArg("s1", "https://10.0.0.5:7200")),
    ("s1=http://storage1:7200@rack1", NodeArg("s1", "http://storage1:7200", "rack1")),
    ("s1=http://storage1:7200@rack1:cold", NodeArg("s1", "http://storage1:7200", "rack1", "cold")),
    ("s1=http://storage1:7200:cold", NodeArg("s1", "http://storage1:7200", "", "cold")),
    ("s1=http://storage1", NodeArg("s1", "http://storage1")),
])
def test_parse_node_accepts(text: str, want: NodeArg) -> None:
    assert parse_node(text) == want


@pytest.mark.parametrize("text, reason", [
    ("s1", "expected ID=URL"),
    ("=http://h:1", "expected ID=URL"),
    ("s1=", "expected ID=URL"),
    ("s1=ftp://h:1", "http://HOST:PORT"),
    ("s1=http://h:99999", "bad URL"),
    ("s1=http://h:1/some/path", "http://HOST:PORT"),
    ("s 1=http://h:1", "node id"),
    ("s1=http://h:1@", "@ZONE"),
    ("s1=http://h:1@z1:", "@ZONE"),
    ("s1=http://h:1@bad zone", "zone"),
])
def test_parse_node_refuses(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_node(text)


def test_repeated_flags_add_up() -> None:
    a = parser().parse_args(["cluster", "bootstrap", "--control", CONTROL, "--storage",
                             "s1=http://a:1,s2=http://b:1", "--storage", "s3=http://c:1"])
    assert [n.id for n in a.storage] == ["s1", "s2", "s3"] and len(a.control) == 3
    assert (a.k, a.m, a.wait_s, a.secret_file) == (4, 2, 120.0, None)


@pytest.mark.parametrize("args, message", [
    (["--storage", STORAGE], "the following arguments are required: --control"),
    (["--control", CONTROL], "the following arguments are required: --storage"),
    (["--control", CONTROL, "--storage", "s1=ftp://x:1"], "argument --storage: s1: URL"),
    (["--control", ",", "--storage", STORAGE], "argument --control: expected ID=URL"),
    (["--control", CONTROL, "--storage", STORAGE, "--k", "four"], "argument --k: invalid int"),
])
def test_argparse_errors_exit_2(args: list[str], message: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["cluster", "bootstrap", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["--storage", STORAGE + ",s1=http://other:7200"], "repeated: s1"),
    (["--storage", STORAGE + ",s7=http://storage1:7200"], "repeated: http://storage1:7200"),
    (["--storage", STORAGE.rsplit(",", 1)[0]], "no valid cluster map"),
    (["--storage", STORAGE, "--k", "0"], "no valid cluster map"),
    (["--storage", STORAGE, "--control", "c4=http://control4:7100:cold"], "tier applies to storage"),
    (["--storage", STORAGE, "--wait-s", "-1"], "--wait-s must be between"),
])
def test_inconsistent_arguments_exit_2(args: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECSTORE_SECRET", "a-secret-of-24-characters")
    assert main(["cluster", "bootstrap", "--control", CONTROL, *args]) == 2
    err = " ".join(capsys.readouterr().err.split())  # undo the console's line wrapping
    assert message in err and "Traceback" not in err


def test_missing_or_short_secret_exits_2(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ECSTORE_SECRET", raising=False)
    base = ["cluster", "bootstrap", "--control", CONTROL, "--storage", STORAGE]
    assert main(base) == 2
    assert "$ECSTORE_SECRET" in capsys.readouterr().err
    assert main([*base, "--secret-file", str(tmp_path / "none")]) == 2
    assert "cannot read the secret file" in capsys.readouterr().err
    (tmp_path / "short").write_text("too-short\n")
    assert main([*base, "--secret-file", str(tmp_path / "short")]) == 2
    assert "at least 16 characters" in " ".join(capsys.readouterr().err.split())
