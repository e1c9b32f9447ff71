from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from replag.cli import main
from replag.config import config_from_dict, load_config, render_config
from replag.errors import ConfigError, UsageError
from replag.settings import SETTINGS, SETTINGS_BY_NAME, Settings, default_settings
from tests.helpers.docs import docs_text

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


def test_every_setting_is_documented() -> None:
    docs = docs_text()
    for setting in SETTINGS:
        assert f"`{setting.name}`" in docs, f"setting {setting.name} missing from docs/"
        assert setting.env_var in docs


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


@pytest.mark.parametrize(
    ("data", "where", "message"),
    [
        ({"regions": [{"name": 5, "write": "redis://h"}]}, "regions[0].name", "expected a string"),
        ({"regions": [{"write": "redis://h"}]}, "regions[0].name", "missing region name"),
        ({"regions": [{"name": "a", "write": {"name": "w"}}]}, "regions[0].write.url",
         "missing endpoint url"),
        ({"regions": [{"name": "a", "write": 7}]}, "regions[0].write",
         "expected a string or a table, got an integer"),
        ({"regions": [{"name": "a", "write": "redis://h", "write_kind": 3}]},
         "regions[0].write_kind", "expected one of redis, dynomite, got an integer"),
        ({"regions": [{"name": "a", "write": {"url": "redis://h", "kind": "proxy"}}]},
         "regions[0].write.kind", "expected one of redis, dynomite, got 'proxy'"),
        ({"regions": [{"name": "a", "write": {"url": "redis://h", "port": 1}}]},
         "regions[0].write", "unknown key 'port' (expected kind, local, name, password_env, "
         "password_file, rack, tls_ca, tls_cert, tls_key, tls_min_version, tls_server_name, "
         "tls_verify, url, username)"),
        ({"regions": [{"name": "a", "write": "redis://h", "slots": [[9, 1]]}]},
         "regions[0].slots[0]", "bad slot range [9, 1]"),
        ({"regions": [{"name": "a", "write": "redis://h", "slots": [[0, 16384]]}]},
         "regions[0].slots[0]", "within 0–16383"),
        ({"regions": [{"name": "a", "write": "redis://h", "replicas": ["redis://h:1",
          {"name": "a-write", "url": "redis://h:2"}]}]}, "regions[0].replicas[1]",
         "duplicate endpoint name 'a-write'"),
        ({"regions": [{"name": "a", "replicas": ["redis://h"]}, {"name": "a", "replicas":
          ["redis://i"]}]}, "regions[1].name", "duplicate region 'a'"),
        ({"regions": [{"name": "a", "write": "redis://h", "write_kind": "dynomite"}],
          "groups": [{"name": "g", "members": ["a-write", "redis://x"]}]}, "groups[0]",
         "group members must be Redis servers"),
        ({"groups": [{"name": "g", "members": ["redis://x"]}]}, "groups[0].members",
         "a group needs at least 2 members"),
        ({"groups": [{"name": "g", "members": ["redis://x", "redis://y:1/z"]}]},
         "groups[0].members[1]", "database must be a number"),
        ({"regions": [{"name": "a", "write": "redis://h"}], "groups": [{"name": "g", "members":
          ["a-write", {"url": "redis://x", "rack": 3}]}]}, "groups[0].members[1].rack",
         "expected a string, got an integer"),
        ({"regions": [{"name": "a", "write": {"url": "redis://h", "password_env": "PW"}}]},
         "regions[0].write.password_env", "environment variable PW is not set"),
        ({"regions": [{"name": "a", "write": "redis://h"}], "alerts": {"sinks": [
          {"name": "s", "kind": "webhook", "url": "http://h", "retries": True}]}},
         "alerts.sinks[0].retries", "expected an integer, got true or false"),
        ({"regions": [{"name": "a", "write": "redis://h"}], "alerts": {"sinks": [
          {"name": "s", "kind": "webhook", "url": "http://h", "retries": 21}]}},
         "alerts.sinks[0].retries", "expected an integer <= 20"),
        ({"regions": [{"name": "a", "write": "redis://h"}], "alerts": {"sinks": [
          {"name": "s", "kind": "webhook", "url": "http://h", "secret": ["hunter2"]}]}},
         "alerts.sinks[0].secret", "expected a string, got an array"),
        ({"regions": [{"name": "a", "write": "redis://h"}], "alerts": {"sinks": [
          {"name": "s", "kind": "webhook", "url": "http://h", "secret": "hunter2",
           "secret_env": "S"}]}}, "alerts.sinks[0].secret_env", "S is not set"),
        ({"regions": [{"name": "a", "write": "redis://h"}], "alerts": {"rules": [
          {"name": "r", "kind": "lag_p99", "over": "0s"}]}}, "alerts.rules[0].over",
         "must be longer than 0s"),
        ({"regions": [{"name": "a", "write": "redis://h"}], "alerts": 5}, "alerts",
         "expected a table, got an integer"),
        ({"regions": [{"name": "a", "write": "redis://h"}], "sinks": []}, "",
         "unknown key 'sinks' (expected alerts, api_tokens, groups, regions, settings)"),
        ({}, "", "no [[regions]] and no [[groups]]"),
    ],
)  # fmt: skip
def test_shape_errors_name_the_key_and_never_echo_a_value(
    data: dict[str, object], where: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, where="replag.toml", environ={})
    assert info.value.where == ("replag.toml: " + where if where else "replag.toml")
    assert message in info.value.message and "hunter2" not in str(info.value)


def test_render_writes_what_the_tables_read_back(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD), environ={})
    text = render_config(config.topology, redact=True, endpoint_comments={"use-b": "rack b"})
    assert "pa55word" not in text and "# rack b" in text
    assert 'local = "redis://10.1.0.3:6379"' in text
    assert 'members = ["use-b", "eu-west-1"]' in text  # declared endpoints by name
    assert 'url = "redis://probe:***@10.0.0.1:6379/2"' in text


def test_render_round_trips_sentinels_agents_slots_and_dynomite(tmp_path: Path) -> None:
    data = {
        "regions": [
            {
                "name": "a",
                "agent": "http://127.0.0.1:9000/",
                "write": {"url": "redis://:s3cret@10.0.0.1:6379", "rack": "r1"},
                "replicas": ["redis://10.0.0.2"],
                "slots": [[0, 8191]],
                "sentinel": {"master": "m", "sentinels": ["10.0.0.9", "redis://:sp@10.0.0.8:1"]},
            },
            {"name": "d", "write": "redis://10.0.1.1:8102", "write_kind": "dynomite"},
        ],
        "groups": [
            {"name": "g", "members": ["a-1", "redis://10.0.2.1:7000"], "slots": [[8192, 16383]]}
        ],
    }
    config = config_from_dict(data, where="t", environ={})
    assert config.topology.region("a").agent == "http://127.0.0.1:9000"
    text = render_config(config.topology, header="discovered\n\nby a test")
    assert text.startswith("# discovered\n#\n# by a test\n")
    again = load_config(write(tmp_path, text), environ={})
    assert again.topology == config.topology
    sentinel = again.topology.region("a").sentinel
    assert sentinel is not None and [s.password for s in sentinel.sentinels] == [None, "sp"]


def test_password_env_fills_endpoint_and_sentinel_passwords() -> None:
    data = {
        "regions": [
            {
                "name": "a",
                "write": {"url": "redis://10.0.0.1", "password_env": "PW"},
                "sentinel": {"master": "m", "sentinels": ["10.0.0.9"], "password_env": "SPW"},
            }
        ],
    }
    region = config_from_dict(data, where="t", environ={"PW": "x1", "SPW": "y2"}).topology.regions[
        0
    ]
    assert region.write is not None and region.write.password == "x1"
    assert region.sentinel is not None and region.sentinel.sentinels[0].password == "y2"
    assert region.sentinel.sentinels[0].address == "10.0.0.9:26379"
