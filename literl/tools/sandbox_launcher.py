"""The first process inside the `python` tool's sandbox (standard library only; run as a script, `-I -S`).

Reads the code on stdin and a JSON configuration in argv[1]. In "namespaced" mode it runs as root inside
fresh network, PID and mount namespaces (`unshare`): it makes every existing mount read-only, puts private
size-limited tmpfs over the world-writable folders (/tmp, /var/tmp, /dev/shm, /run/lock) and the working
directory inside /tmp, hides folders other users cannot enter on the interpreter's path (/root) behind an
empty tmpfs, and binds the interpreter's own folders back read-only (from handles opened before hiding, so an
interpreter under /root or /tmp stays runnable). It then forks the user's code under
resource limits as an unprivileged user id of its own, waits for it and writes its wait status to the status
pipe. Being PID 1 of the namespace, its exit ends every process the code started.

In "basic" mode (no root or no `unshare`) only the resource limits, the clean environment and the working
directory apply; `literl.tools.sandbox` documents what that leaves open.
"""

import ctypes
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
SKIP_READ_ONLY = ("/proc", "/sys", "/dev")   # kernel views and device nodes: left as they are
PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _mount(libc, source, target, fstype, flags, data=None):
    result = libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                        data and data.encode())
    if result != 0:
        raise OSError(ctypes.get_errno(), f"mount {target}: {os.strerror(ctypes.get_errno())}")


def _mount_points():
    with open("/proc/self/mountinfo") as info:
        return [line.split()[4].replace("\\040", " ") for line in info]


def _confine_filesystem(config, notes):
    libc = ctypes.CDLL(None, use_errno=True)
    # The interpreter's folders are opened before anything is hidden, and bound back from those handles
    # afterwards: an interpreter under /root (closed to other users) or under /tmp (covered by the private
    # tmpfs) stays runnable, while the rest of those folders stays out of sight.
    hidden = []
    kept = []
    for folder in config["interpreter_dirs"]:
        closed = _first_closed_ancestor(folder)
        private = any(folder == p or folder.startswith(p + "/") for p in PRIVATE_TMPFS)
        if closed is not None and not private:
            hidden.append(closed)
        if closed is not None or private:
            kept.append((folder, os.open(folder, os.O_PATH | os.O_DIRECTORY)))
    for point in sorted(set(_mount_points()), key=len):
        if any(point == skip or point.startswith(skip + "/") for skip in SKIP_READ_ONLY):
            continue
        try:
            _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
        except OSError as exc:
            notes.append(str(exc))
            if point == "/":
                raise
    size = f"size={config['tmpfs_mb']}m"
    for folder in PRIVATE_TMPFS:
        if os.path.isdir(folder):
            _mount(libc, "tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777")
    hidden = [h for h in sorted(set(hidden), key=len) if not any(h.startswith(o + "/") for o in hidden)]
    for folder in hidden:
        _mount(libc, "tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for folder, handle in kept:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        _mount(libc, f"/proc/self/fd/{handle}", folder, None, MS_BIND | MS_REC)
        _mount(libc, None, folder, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(handle)
    for folder in hidden:
        _mount(libc, None, folder, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")


def _first_closed_ancestor(path):
    """The outermost folder on `path` that others may not enter (no o+x), or None."""
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = os.path.join(current, part)
        if not os.stat(current).st_mode & 0o001:
            return current
    return None


def _limit(config):
    def both(kind, value):
        resource.setrlimit(kind, (value, value))
    cpu = int(config["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))   # soft: SIGXCPU, then SIGKILL a second later
    both(resource.RLIMIT_AS, config["memory_mb"] * 1024 * 1024)
    both(resource.RLIMIT_FSIZE, config["file_size_mb"] * 1024 * 1024)
    both(resource.RLIMIT_CORE, 0)
    both(resource.RLIMIT_NOFILE, 64)
    if config["max_processes"]:
        both(resource.RLIMIT_NPROC, config["max_processes"])


def main():
    config = json.loads(sys.argv[1])
    status_fd = config["status_fd"]
    code = sys.stdin.buffer.read()
    notes = []
    namespaced = config["mode"] == "namespaced"
    if namespaced:
        _confine_filesystem(config, notes)
        workdir = "/tmp/work"
        os.mkdir(workdir, 0o700)
        os.chown(workdir, config["uid"], config["uid"])
    else:
        workdir = config["workdir"]
    script = os.path.join(workdir, "snippet.py")
    with open(script, "wb") as out:
        out.write(code)
    if namespaced:
        os.chown(script, config["uid"], config["uid"])
    pid = os.fork()
    if pid == 0:
        try:
            os.close(status_fd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            if namespaced:
                os.setsid()
            _limit(config)
            if namespaced:
                os.setgroups([])
                os.setgid(config["uid"])
                os.setuid(config["uid"])
            os.chdir(workdir)
            python = config["python"]
            os.execve(python, [python, "-I", "-B", script], config["env"])
        except BaseException as exc:  # noqa: BLE001 - report why the code could not start, then leave
            os.write(2, f"sandbox: could not start the code: {exc}\n".encode())
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    os.write(status_fd, json.dumps({"status": status, "notes": notes}).encode())


if __name__ == "__main__":
    main()
