from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from replag.cli import main
from replag.config import config_from_dict, load_config, render_config
from replag.errors import ConfigError, UsageError
from replag.settings import SETTINGS, SETTINGS_BY_NAME, Settings, default_settings

GOOD = """
[settings]
timeout = "3s"
max_p99 = "200ms"

[[regions]]
name = "us-east"
write = "redis://probe:pa55word@10.0.0.1:6379/2"
replicas = ["redis://10.0.0.2:6379", { name = "use-b", url = "rediss://10.0.0.3:6380", rack = "b" }]

[[regions]]
name = "eu-west"
replicas = [
  "redis://10.1.0.2",
  { name = "euw-b", url = "redis://:pw@10.9.0.1:7001", local = "redis://10.1.0.3:6379" },
]

[[groups]]
name = "main"
members = ["use-b", "eu-west-1"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "replag.toml"
    path.write_text(text)
    return path


def test_a_good_file_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), environ={})
    assert config.settings.timeout == 3.0 and config.settings.max_p99 == 0.2
    east = config.topology.region("us-east")
    assert east.write is not None and east.write.db == 2 and east.write.password == "pa55word"
    assert [r.name for r in east.replicas] == ["us-east-1", "use-b"]
    assert east.replicas[1].tls and east.replicas[1].rack == "b"
    assert [m.name for m in config.topology.group("main").members] == ["use-b", "eu-west-1"]


def test_local_address_is_the_same_server_from_inside_its_region(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), environ={})
    far = config.topology.region("eu-west").replicas[1]
    assert (far.address, far.local) == ("10.9.0.1:7001", ("10.1.0.3", 6379))
    inside = far.in_region()
    assert (inside.address, inside.password, inside.local) == ("10.1.0.3:6379", "pw", None)
    assert far.to_dict()["local"] == "10.1.0.3:6379" and "pw" not in str(far.to_dict())


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), environ={"REPLAG_TIMEOUT": "750ms"})
    assert config.settings.timeout == 0.75


def test_passwords_never_appear_in_output(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), environ={})
    east = config.topology.region("us-east")
    assert "pa55word" not in repr(east) and "pa55word" not in str(config.topology.to_dict())
    assert east.write is not None and east.write.url() == "redis://probe:***@10.0.0.1:6379/2"


def test_render_round_trips(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), environ={})
    again = load_config(write(tmp_path, render_config(config.topology)), environ={})
    assert again.topology == config.topology


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[regions]\nname=1", "invalid TOML"),
        ('[[regions]]\nname = "a"\nwrite = "http://x"', "regions[0].write: not a Redis URL"),
        ('[[regions]]\nname = "a"', "regions[0]: a region needs a write endpoint"),
        ('[[regions]]\nname = "a"\nwrite = "redis://h"\nbogus = 1', "unknown key 'bogus'"),
        (
            '[settings]\ntimeout = "soon"\n[[regions]]\nname = "a"\nwrite = "redis://h"',
            "settings.timeout: not a duration",
        ),
        ("[settings]\nwat = 1", "unknown setting 'wat'"),
        (
            '[[groups]]\nname = "g"\nmembers = ["nobody", "redis://h"]',
            "groups[0].members[0]: no endpoint named 'nobody'",
        ),
        ('[[regions]]\nname = "a"\nwrite = "redis://h:99999"', "bad port"),
        (
            '[[regions]]\nname = "a"\nwrite = { url = "redis://h", local = "http://x" }',
            "regions[0].write.local: not a Redis URL",
        ),
        (
            '[[regions]]\nname = "a"\nwrite = { url = "redis://h", local = "redis://:p@x" }',
            "regions[0].write.local: credentials belong in `url`",
        ),
        (
            '[[regions]]\nname = "a"\nwrite = { url = "redis://h", local = "rediss://x" }',
            "regions[0].write.local: scheme differs",
        ),
        (
            '[settings]\nprobe_interval = inf\n[[regions]]\nname = "a"\nwrite = "redis://h"',
            "settings.probe_interval: not a finite",
        ),
        (
            '[settings]\nrate = nan\n[[regions]]\nname = "a"\nwrite = "redis://h"',
            "settings.rate: expected a finite",
        ),
        (
            '[[regions]]\nname = "a"\nwrite = "redis://h"\n[alerts]\n[[alerts.rules]]\n'
            'name = "x"\nkind = "probe_loss"\nthreshold = nan',
            "threshold: expected a finite",
        ),
    ],
)
def test_bad_files_name_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert str(path) in str(info.value)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("max_inflight = 0", "settings.max_inflight: expected an integer of at least 1"),
        ("max_loss = 1.5", "settings.max_loss: expected a ratio from 0 to 1"),
        ('ttl_tolerance = "0s"', "settings.ttl_tolerance: expected a duration above 0"),
        ('repair_settle = "0ms"', "settings.repair_settle: expected a duration above 0"),
    ],
)
def test_settings_that_cannot_work_are_refused_in_the_file(
    tmp_path: Path, setting: str, expected: str
) -> None:
    path = write(tmp_path, f'[settings]\n{setting}\n[[regions]]\nname = "a"\nwrite = "redis://h"')
    result = CliRunner().invoke(main, ["repair", "check", "--config", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and expected in lines[0]


def test_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    path = write(tmp_path, '[[regions]]\nname = "a"\nwrite = "redis://:hunter2@h:70000"')
    result = CliRunner().invoke(main, ["probe", "--config", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "regions[0].write" in lines[0]
    assert "hunter2" not in result.output


def test_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["probe", "--config", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2 and "no such file" in result.output


def test_bad_environment_value_is_named() -> None:
    with pytest.raises(ConfigError, match="REPLAG_COUNT"):
        config_from_dict(
            {"regions": [{"name": "a", "write": "redis://h"}]},
            where="x",
            environ={"REPLAG_COUNT": "many"},
        )


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for setting in SETTINGS:
        assert f"`{setting.name}`" in readme, f"setting {setting.name} missing from README"
        assert setting.env_var in readme


def test_secret_settings_are_masked() -> None:
    settings = default_settings().replace(api_token="t0ken")
    assert "t0ken" not in repr(settings) and settings.public()["api_token"] == "***"


def test_settings_are_typed_frozen_and_their_defaults_are_the_table() -> None:
    settings = default_settings()
    assert settings == Settings()  # the class's defaults are the table's, parsed
    assert settings.connect_timeout == 2.0 and settings.dynomite_stats_urls == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.count = 5  # type: ignore[misc]
    changed = settings.replace(count="7", mode=None)
    assert (changed.count, changed.mode, settings.count) == (7, "auto", 200)
    with pytest.raises(UsageError, match="--mode: expected one of auto, push, poll"):
        settings.replace(mode="sideways")


def test_cli_options_take_help_and_choices_from_the_settings_table() -> None:
    out = CliRunner().invoke(main, ["probe", "--help"], terminal_width=400).output
    for name in ("count", "rate", "mode", "timeout", "max_p99", "max_loss"):
        assert SETTINGS_BY_NAME[name].help in out and f"[settings.{name}, default" in out
    assert "[auto|push|poll]" in out
