"""Copy the working tree (tracked and untracked files, none that git ignores)
into the folder given as the only argument, keeping relative paths. Used by
.ci/run to build the wheel from exactly what a clean checkout would hold."""

import shutil
import subprocess
import sys
from pathlib import Path

dst = Path(sys.argv[1])
listed = subprocess.run(
    ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, check=True
).stdout.split(b"\0")
for name in filter(None, listed):
    path = Path(name.decode())
    if path.is_file():  # tracked files deleted from the working tree are listed too
        (dst / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dst / path)
