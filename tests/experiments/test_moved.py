"""Every command a results folder records runs today: its module exists, or
the folder says the command it runs as since its study moved
(experiments/README.md, "Moved")."""

import importlib.util
import json
import shlex
import shutil
from pathlib import Path

from experiments import COMMANDS, MOVED
from experiments.common.results import annotate_moved, moved_command

ROOT = Path(__file__).resolve().parents[2]


def _runs(command: str) -> bool:
    """`python -m MODULE ...` names a module python can run (a file, or a
    folder with __main__.py); any other command is not this test's."""
    words = shlex.split(command)
    if words[:2] != ["python", "-m"]:
        return True
    spec = importlib.util.find_spec(words[2])
    if spec is None:
        return False
    return spec.submodule_search_locations is None or importlib.util.find_spec(words[2] + ".__main__") is not None


def test_every_recorded_command_runs_today_or_says_what_runs_it():
    for run in sorted(ROOT.glob("results/*/run.json")):
        recorded = json.loads(run.read_text())
        command = recorded["command"]
        if _runs(command):
            continue
        now = recorded.get("command_now")
        assert now == moved_command(command) and _runs(now), f"{run}: {command!r} no longer runs"
        assert f"Run today as `{now}`" in (run.parent / "results.md").read_text()


def test_a_moved_command_keeps_its_arguments_and_is_annotated_once(tmp_path):
    for old, name in MOVED.items():
        assert importlib.util.find_spec(old) is None  # the old module is gone: the annotation is needed
        assert moved_command(f"python -m {old} a --b 'c d'") == f"python -m {COMMANDS[name]} a --b 'c d'"
    assert moved_command("python -m experiments.convert --quick") is None
    folder = tmp_path / "convert-recipes-v3"
    shutil.copytree(ROOT / "results" / "convert-recipes-v3", folder)
    run = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({k: v for k, v in run.items() if k != "command_now"}, indent=1))
    md = (folder / "results.md").read_text()
    (folder / "results.md").write_text("\n".join(x for x in md.split("\n") if not x.startswith("Run today as")))
    assert annotate_moved(folder) and not annotate_moved(folder)
    now = json.loads((folder / "run.json").read_text())["command_now"]
    assert now.startswith("python -m experiments.pilots runs/pilot-base/step-00000010 ")
    assert (folder / "results.md").read_text().count(f"Run today as `{now}`") == 1


def test_each_conversion_study_runs_as_python_m_and_refuses_bad_input_with_exit_2():
    """Its folder's __main__ gives the exit codes of every latte command
    (a bad value: 2, naming the command), never the retired verb's name."""
    import os
    import subprocess
    import sys

    bad = {
        "experiments.convert": ["--stages", "nope"],
        "experiments.sinks": ["--sinks", "x"],
        "experiments.pilots": ["--threads", "0", "runs/none"],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {
        m: subprocess.Popen([sys.executable, "-m", m, *a], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        for m, a in bad.items()
    }
    for m, p in procs.items():
        err = p.communicate(timeout=300)[1]
        assert p.returncode == 2, (m, err[-500:])
        assert f"python -m {m}" in err and "latte experiment" not in err and "Traceback" not in err, (m, err)


def test_a_study_folder_names_its_files_for_their_role_not_for_itself():
    """experiments/README.md: a study's files do not repeat its folder's name
    (convert/convert_stages.py is convert/stages.py)."""
    repeated = [
        str(p.relative_to(ROOT))
        for folder in sorted((ROOT / "experiments").iterdir())
        if (folder / "__main__.py").is_file()
        for p in sorted(folder.glob("*.py"))
        if p.stem == folder.name or p.stem.startswith(folder.name.split("_")[0] + "_")  # lm_variants: lm_*
    ]
    assert not repeated, f"study files that repeat their folder's name: {repeated}"
