"""How far a reader walks to follow one job: the memsweep functions it calls, in the order first called."""
import os, sys, runpy, pathlib
ROOT = pathlib.Path(sys.argv[1]).resolve()
SRC = str(ROOT / "src" / "memsweep")
seen, order = set(), []
def prof(frame, event, arg):
    if event != "call":
        return
    f = frame.f_code.co_filename
    if f.startswith(SRC) or f == str(ROOT / "train.py"):
        key = (f, frame.f_code.co_qualname)
        if key not in seen and "<" not in frame.f_code.co_qualname:
            seen.add(key); order.append(key)
sys.argv = ["train.py"] + sys.argv[2:]
os.chdir(ROOT)
sys.path.insert(0, str(ROOT))
sys.setprofile(prof)
try:
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
except SystemExit:
    pass
finally:
    sys.setprofile(None)
    files = [os.path.relpath(f, ROOT) for f, _ in order]
    returns, left, prev = 0, set(), None
    for f in files:
        if f != prev:
            if f in left: returns += 1
            if prev: left.add(prev)
            prev = f
    out = os.environ.get("PATH_OUT", "/tmp/reading_path.txt")
    with open(out, "w") as fh:
        for f, q in order: fh.write(f"{os.path.relpath(f, ROOT)}  {q}\n")
        fh.write(f"steps {len(order)}  files {len(set(files))}  returns {returns}\n")
    print(f"reading path: steps {len(order)}  files {len(set(files))}  returns to a file already left {returns}", file=sys.stderr)
