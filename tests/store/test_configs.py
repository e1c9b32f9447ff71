"""One store per config: `replag serve` refuses a store another config's serve used,
unless both say `store_shared = true`."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from replag.errors import ConfigError
from replag.lab.server import free_port
from replag.store import Store
from replag.store.configs import claim_for_config
from tests.helpers.cli import run_replag


def test_a_store_serves_one_config_unless_shared(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite") as store:
        claim_for_config(store, "/etc/replag/a.toml", shared=False, where="s.sqlite")
        claim_for_config(store, "/etc/replag/a.toml", shared=False, where="s.sqlite")  # again
        with pytest.raises(ConfigError, match=r"another config \(/etc/replag/a.toml\)"):
            claim_for_config(store, "/etc/replag/b.toml", shared=False, where="s.sqlite")
        claim_for_config(store, "/etc/replag/b.toml", shared=True, where="s.sqlite")


def test_a_moved_config_takes_over_its_sqlite_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a SQLite store every claimant is on this host: a claim whose file is gone was
    a config moved or deleted, released with a warning. Elsewhere (`local=False`, a
    PostgreSQL store other hosts share) a path this host cannot see still refuses."""
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text("")
    with Store(tmp_path / "s.sqlite") as store:
        claim_for_config(store, str(old), shared=False, where="s.sqlite", local=True)
        with pytest.raises(ConfigError, match="another config"):  # both files exist
            claim_for_config(store, str(new), shared=False, where="s.sqlite", local=True)
        old.rename(new)
        with pytest.raises(ConfigError, match="another config"):  # not local: refused
            claim_for_config(store, str(new), shared=False, where="s.sqlite")
        with caplog.at_level("WARNING", logger="replag.store.configs"):
            claim_for_config(store, str(new), shared=False, where="s.sqlite", local=True)
        claimed = {str(r.config) for r in store.execute("SELECT config FROM store_configs")}
        assert claimed == {str(new)}
        assert f"claimed by {old}, which no longer exists" in caplog.text


def test_serve_on_another_configs_store_is_one_line_and_exit_2(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite"
    (tmp_path / "other.toml").write_text("")  # the other config is still there
    with Store(store) as s:
        claim_for_config(s, str(tmp_path / "other.toml"), shared=False, where=str(store))
    config = tmp_path / "mine.toml"
    config.write_text(tomli_w.dumps({
        "settings": {"store": str(store)},
        "regions": [{"name": "us-east", "write": f"redis://127.0.0.1:{free_port()}"}],
    }))  # fmt: skip
    proc = run_replag("serve", "--config", str(config), "--port", "0", timeout=60)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"holds the data of another config ({tmp_path / 'other.toml'})" in line
    assert "store_shared = true" in line


@pytest.mark.parametrize(
    "args",
    [("repair", "check"), ("repair", "run"), ("probe",)],
    ids=["check", "run", "probe"],
)
def test_a_cli_run_into_another_configs_store_is_one_line_and_exit_2(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """The CLI's runs write into the store as serve does (runs, windows, gauges the
    dashboard reads): the same claim, before any Redis is asked."""
    store = tmp_path / "s.sqlite"
    (tmp_path / "other.toml").write_text("")  # the other config is still there
    with Store(store) as s:
        claim_for_config(s, str(tmp_path / "other.toml"), shared=False, where=str(store))
    config = tmp_path / "mine.toml"
    data = {
        "settings": {"store": str(store)},
        "regions": [{"name": "us-east", "write": f"redis://127.0.0.1:{free_port()}"}],
    }
    config.write_text(tomli_w.dumps(data))
    proc = run_replag(*args, "--config", str(config), timeout=60)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"holds the data of another config ({tmp_path / 'other.toml'})" in line
    # Shared on purpose: the claim passes (the run then finds no Redis, and says so).
    data["settings"]["store_shared"] = True
    config.write_text(tomli_w.dumps(data))
    proc = run_replag(*args, "--config", str(config), timeout=60)
    assert "another config" not in proc.stderr
    with Store(store) as s:
        claimed = {str(r.config) for r in s.execute("SELECT config FROM store_configs")}
    assert str(config.resolve()) in claimed
