"""``config.toml`` is written by ``gw run`` and read back by ``--config``, ``--resume`` and the
background study; a configuration file may come from someone else. Every string written reads
back as itself (a quote, a backslash or a newline in ``scheduler`` made the file unreadable or
another configuration), and every value read that cannot be a configuration is one line of
``rootclad gw run: error:`` naming the file and the key (a 400-digit integer and a 5000-deep
array raised OverflowError and RecursionError)."""

from __future__ import annotations

import dataclasses

import pytest
import tomllib

from rootclad.cli import main
from rootclad.gw.run.config import ConfigError, RunConfig, resolve

# what a TOML basic string must escape, what it must not, and text that looks like an escape
HOSTILE = [
    '"',
    "\\",
    "\n",
    'x"\nseed = 5\n#',
    'tcp://h:1"\nworkers = 7',
    "\\u0041",
    "\\n",
    "'''",
    '"""',
    "\t\r\x00\x1f\x7f",
    "\x08\x0c\x1b",
    "\u2028\u0085é😀\ufeff",
    "a\\",
    " both ends ",
    "",
]


@pytest.mark.parametrize("field", ["approximant", "scheduler"])
def test_every_string_written_reads_back_as_itself(field):
    base = tomllib.loads(RunConfig().to_toml())
    for text in HOSTILE:
        cfg = dataclasses.replace(RunConfig(), **{field: text})
        assert tomllib.loads(cfg.to_toml()) == {**base, field: text}, repr(text)


def test_a_written_configuration_resolves_to_itself(tmp_path):
    path = tmp_path / "config.toml"
    for text in HOSTILE:
        cfg = resolve(scheduler=text)
        path.write_text(cfg.to_toml())
        assert resolve(path) == cfg, repr(text)


def test_the_toml_writer_escapes_every_character_and_refuses_what_toml_cannot_hold():
    from rootclad.gw.run.config import toml_value

    every = "".join(map(chr, [*range(0xD800), *range(0xE000, 0x11000), 0x10FFFF]))
    assert tomllib.loads(f"k = {toml_value(every)}")["k"] == every
    for v in (0, -(2**63), 2**63 - 1, 1e-300, 5e-324, 1.7976931348623157e308, 0.1, -0.0):
        assert tomllib.loads(f"k = {toml_value(v)}")["k"] == v
    assert tomllib.loads(f"k = {toml_value((2.0, 1e-5))}")["k"] == [2.0, 1e-5]
    for bad in (2**63, "\udcff", None, True, {"a": 1}):
        with pytest.raises((ValueError, TypeError)):
            toml_value(bad)


def test_text_that_is_not_utf8_is_refused_naming_the_key():
    """Python hands an argument's undecodable bytes over as surrogates, which no TOML file
    can hold: refused before anything is written."""
    with pytest.raises(ConfigError, match="scheduler must be text"):
        resolve(scheduler="tcp://h\udcff:1")


BIG = "1" + "0" * 400


@pytest.mark.parametrize(
    "text, key",
    [
        pytest.param(f"lr = {BIG}", "lr", id="400-digit float"),
        pytest.param(f"train_events = {BIG}", "train_events", id="400-digit count"),
        pytest.param(f"seed = -{BIG}", "seed", id="400-digit negative seed"),
        pytest.param(f"duration = {BIG}", "duration", id="400-digit duration"),
        pytest.param(f"snr = [1, {BIG}]", "snr", id="400-digit pair"),
        pytest.param("lr = 1e400", "lr", id="infinite float"),
        pytest.param("mass_range = " + "[" * 5000 + "]" * 5000, None, id="5000-deep array"),
        pytest.param(
            "scheduler = '" + "x" * 3000 + "'\nepochs = [" + "1, " * 3000 + "]",
            "epochs",
            id="long values",
        ),
    ],
)
def test_a_value_that_cannot_be_a_configuration_is_one_line_naming_file_and_key(
    tmp_path, capsys, text, key
):
    config = tmp_path / "run.toml"
    config.write_text(text + "\n")
    out = tmp_path / "out"
    status = main(["gw", "run", "-q", "--config", str(config), "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"rootclad gw run: error: {config}: "), err
    assert err.count("\n") == 1 and len(err) < 400, err  # one line, the value shortened
    if key is not None:
        assert f": {key} " in err, err
    assert not out.exists()


def test_a_file_that_is_not_utf8_names_itself(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_bytes(b"approximant = '\xff'\n")
    status = main(["gw", "run", "-q", "--config", str(config), "--out", str(tmp_path / "o")])
    assert status == 2
    assert capsys.readouterr().err.startswith(f"rootclad gw run: error: {config}: not UTF-8")
