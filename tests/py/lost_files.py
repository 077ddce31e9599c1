"""What the nothing-lost tests share: what a path is (snapshot), the temporary files left
behind (leftovers), a FIFO's reader, and small file helpers."""
import hashlib
import os
import stat
import threading


def snapshot(path):
    """What a path is: its kind, and the bytes of a regular file or a link's text."""
    if not os.path.lexists(path):
        return ("missing",)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            return ("file", hashlib.sha256(f.read()).hexdigest(), stat.S_IMODE(st.st_mode))
    if stat.S_ISCHR(st.st_mode):
        return ("chr", os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISFIFO(st.st_mode):
        return ("fifo",)
    if stat.S_ISDIR(st.st_mode):
        return ("dir", stat.S_IMODE(st.st_mode))
    return ("other", st.st_mode)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data, mode=0o644):
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


class FifoReader:
    """Reads a FIFO in a thread, so that a writer's open() returns (as `cat fifo &`)."""

    def __init__(self, path):
        self.data, self.path = b"", path
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        with open(self.path, "rb") as f:
            self.data = f.read()

    def join(self):
        """The data; a reader no writer opened (a run that failed first) is let go."""
        self.t.join(timeout=0.5)
        if self.t.is_alive():
            try:
                os.close(os.open(self.path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        self.t.join(timeout=60)
        return self.data


def leftovers(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs if ".tmp." in f)


def lines_file(work, name, lines):
    """work/name holding the lines, one per line; its path."""
    p = os.path.join(work, name)
    with open(p, "w") as f:
        f.write("".join(x + "\n" for x in lines))
    return p
