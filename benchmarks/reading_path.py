"""How far a reader walks to follow one job: `python benchmarks/reading_path.py [train.py overrides]`.

Runs train.py in this process with the given overrides (e.g. `mode=estimate logger=none`) and records every
memsweep function (and train.py's) in the order it is first called. A reader following the job meets them in
that order: the script prints how many functions (steps), how many files, and how many times the path goes
back to a file it had already left. `--out FILE` writes the path itself, one function a line.
"""
import argparse
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def record(overrides: list[str]) -> list[tuple[str, str]]:
    """(file, function) of each memsweep function train.py calls, first calls only, in order."""
    package, entry = str(ROOT / "src" / "memsweep"), str(ROOT / "train.py")
    seen: set[tuple[str, str]] = set()
    path: list[tuple[str, str]] = []

    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or "<" in code.co_qualname:  # comprehensions, lambdas and module bodies aside
            return
        if code.co_filename.startswith(package) or code.co_filename == entry:
            key = (os.path.relpath(code.co_filename, ROOT), code.co_qualname)
            if key not in seen:
                seen.add(key)
                path.append(key)

    sys.argv = ["train.py", *overrides]
    os.chdir(ROOT)
    sys.setprofile(profile)
    try:
        runpy.run_path(entry, run_name="__main__")
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
    return path


def returns(files: list[str]) -> int:
    """How many times the path enters a file it had left before."""
    left, current, count = set(), None, 0
    for name in files:
        if name != current:
            count += name in left
            if current is not None:
                left.add(current)
            current = name
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the path, one function a line")
    args, overrides = parser.parse_known_args()
    path = record(overrides)
    files = [name for name, _ in path]
    if args.out:
        args.out.write_text("".join(f"{name}  {function}\n" for name, function in path))
    print(f"reading path of train.py {' '.join(overrides)}: {len(path)} functions in {len(set(files))} files, "
          f"{returns(files)} returns to a file already left", file=sys.stderr)


if __name__ == "__main__":
    main()
