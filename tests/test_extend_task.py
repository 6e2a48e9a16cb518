"""docs/extending.md's "A new task", followed literally: its files written into a folder of their
own, its command run there, as a user would (a new process, the folder on ``PYTHONPATH``)."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', re.M | re.S)


def section(title: str) -> str:
    """The text of docs/extending.md's ``## <title>`` section, up to the next ``## ``."""
    text = (ROOT / "docs" / "extending.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_a_new_task_is_its_module_and_its_yaml_run_from_the_command_line(tmp_path):
    blocks = FENCE.findall(section("A new task"))
    files = {title: body for _, title, body in blocks if title}
    assert set(files) == {"mypkg/__init__.py", "mypkg/conf/__init__.py", "mypkg/tasks.py",
                          "mypkg/conf/task/hallway.yaml"}
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    (command,) = [body.strip() for lang, title, body in blocks if lang == "bash" and not title]
    env_part, *args = shlex.split(command)
    assert env_part == "PYTHONPATH=." and args[:3] == ["python", "-m", "harness"]
    # the doc's command, with a budget of two iterations and the outputs in tmp_path; this
    # checkout's harness (not an installed one) beside the user's folder
    tiny = ["budget.iterations=2", "budget.env_steps=null", "progress=false", f"results_dir={tmp_path / 'results'}",
            f"hydra.run.dir={tmp_path / 'hydra'}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    r = subprocess.run([sys.executable, *args[1:], *tiny], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    (summary,) = (tmp_path / "results").rglob("summary.json")
    assert summary.parent.parent.parent.name == "hallway" and summary.parent.parent.name == "reinforce"
    done = json.loads(summary.read_text())
    assert done["status"] == "completed" and done["iterations"] == 2
