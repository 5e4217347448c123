"""compat scenario `users`: a node shared by users who do not trust each other (issue 32,
item 3; docs/operations.md, "A node shared by users who do not trust each other").

As built and documented: each user mounts a db of their own (no allow_other: the
kernel lets no one else in, root included), and every mount reads through one shared,
trusted layer, the shared tier (a node-local redis-server here), taking only entries
signed by a key in the root-owned trust file. Real uids made here (useradd), each
user's own kcache-fsd, and Triton's own launcher cache code (workers/launcher_worker.py:
the key Triton derives for a `cuda_utils` module from its source, FileCacheManager,
exec_module) run as each user:

1. alice plants a `cuda_utils` whose module init leaves a mark, under the key bob's
   Triton derives, through her own mount (uploaded to the shared layer, signed by a key
   of her own). Her own Triton loads it (the control: the plant works). Bob's Triton
   never does: bob's daemon refuses her entry as untrusted (counted, named by `kcache
   why`), his Triton compiles its own module and loads that.
2. alice cannot reach bob's mount or his db at all (EACCES).
3. a kernel from the trusted producer (root's mount, signing with the key the trust file
   names) is shared: bob's and alice's Triton load it with no C compiler to call.
4. bob's own compile stays his: through alice's mount its key is a miss.
"""

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import compat
from compat import C, Daemon, RedisServer, Skip, log, run

HERE = Path(__file__).resolve().parent
USERS = ("kcache-alice", "kcache-bob")


class User:
    """A uid of this scenario's own, made with useradd unless it exists, with a
    private directory (HOME, db, keys) under the scenario's tmp."""

    def __init__(self, name, tmp):
        self.name = name
        self.made = False
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                 name])
            self.made = True
            pw = pwd.getpwnam(name)
        self.uid, self.gid = pw.pw_uid, pw.pw_gid
        self.home = Path(tmp) / name
        self.home.mkdir(mode=0o700)
        os.chown(self.home, self.uid, self.gid)

    def run(self, argv, env=None, timeout=300, check=True):
        """argv as this user, with HOME in its own directory."""
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
                    "LANG": "C.UTF-8", "LD_LIBRARY_PATH": os.environ["LD_LIBRARY_PATH"]}
        full_env.update(env or {})
        r = subprocess.run([str(a) for a in argv], env=full_env, cwd=self.home,
                           user=self.uid, group=self.gid, extra_groups=[],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"as {self.name}: {' '.join(map(str, argv))} exited "
                               f"{r.returncode}\nstdout: {r.stdout[-3000:]}\n"
                               f"stderr: {r.stderr[-5000:]}")
        return r

    def remove(self):
        if self.made:
            subprocess.run(["userdel", self.name], capture_output=True, timeout=60)


class UserDaemon(Daemon):
    """kcache-fsd run by USER, its db in the user's directory; the mount point is
    MNT (a directory the user owns that everyone may look into, so that what keeps
    another user out is the mount itself)."""

    def __init__(self, cfg, user, mnt, args):
        super().__init__(cfg, user.home, args)
        self.user = user
        self.mnt = Path(mnt)
        self.mnt.mkdir(mode=0o755)
        os.chown(self.mnt, user.uid, user.gid)

    def start(self):
        argv = [self.cfg.fsd, "-f", "--db", str(self.db), *self.args, str(self.mnt)]
        self.log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, cwd=self.user.home,
                                     env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                          "HOME": str(self.user.home),
                                          "LD_LIBRARY_PATH": os.environ["LD_LIBRARY_PATH"]},
                                     user=self.user.uid, group=self.user.gid,
                                     extra_groups=[], preexec_fn=compat._pdeathsig)
        Daemon.live.append(self)
        deadline = time.time() + 15
        while not compat.in_mountinfo(self.mnt):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"kcache-fsd did not mount {self.mnt} as "
                                   f"{self.user.name}: {self.stderr()}")
            time.sleep(0.02)
        return self

    def kcache(self, *args, timeout=60):
        return self.user.run([self.cfg.kcache, "--db", self.db, *args], timeout=timeout)


def copy_for_users(cfg, tmp):
    """Copies kcache-fsd, kcache and the build-tree libraries they load into TMP/bin, and
    points cfg at the copies: the build tree may sit below a directory other users
    cannot enter (a clone under /root). Returns the LD_LIBRARY_PATH to run them with."""
    bin_dir = Path(tmp) / "bin"
    bin_dir.mkdir(mode=0o755)
    build = Path(cfg.fsd).resolve().parents[1]
    for name in ("fsd", "kcache"):
        program = Path(getattr(cfg, name)).resolve()
        for line in run(["ldd", program]).stdout.splitlines():
            lib = line.split("=>")[-1].split("(")[0].strip()
            if lib.startswith(str(build) + os.sep) and not (bin_dir / Path(lib).name).exists():
                shutil.copy2(lib, bin_dir / Path(lib).name)
        shutil.copy2(program, bin_dir / program.name)
        setattr(cfg, name, str(bin_dir / program.name))
    return str(bin_dir)


def user_python(cfg):
    """(python, env) that another uid can run with the venv's packages: the venv's own
    interpreter where they may run it, else the system's python3 of the same version
    with the venv's site-packages on PYTHONPATH (setup.sh's venv may be made from an
    interpreter under a private home, such as pyenv's under /root)."""
    site_packages = run([cfg.python, "-c", "import site; print(site.getsitepackages()[0])"]
                        ).stdout.strip()
    if not others_reach(site_packages):
        raise Skip(f"the venv's packages ({site_packages}) are below a directory other users "
                   "cannot enter: clone kcache where they can (its test makes users)")
    if others_reach(os.path.realpath(cfg.python)):
        return cfg.python, {}
    system = shutil.which("python3", path="/usr/bin:/bin")
    suffix = "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"
    if not system or run([system, "-c", suffix]).stdout != run([cfg.python, "-c", suffix]).stdout:
        raise Skip(f"{cfg.python} is not runnable by other users and no /usr/bin/python3 "
                   "of its version is")
    return system, {"PYTHONPATH": site_packages}


def others_reach(path):
    """Whether a user other than the owner may enter every directory down to PATH."""
    parts = Path(path).parts
    return all(os.stat(Path(*parts[:i])).st_mode & stat.S_IXOTH for i in range(2, len(parts) + 1))


LAUNCHER = r"""#include <Python.h>
#include <stdio.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "cuda_utils", 0, -1, 0};
PyMODINIT_FUNC PyInit_cuda_utils(void) {
%s
    PyObject* m = PyModule_Create(&def);
    if (m) PyModule_AddStringConstant(m, "who", "%s");
    return m;
}
"""


def launcher_source(tmp, who, mark=None):
    body = ""
    if mark:  # what a planted launcher could do with the reader's rights
        body = f'    FILE* f = fopen("{mark}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}'
    path = Path(tmp) / f"{who}.c"
    path.write_text(LAUNCHER % (body, who))
    path.chmod(0o644)
    return path


class Triton:
    """Runs workers/launcher_worker.py as a user (or root) on a cache directory."""

    def __init__(self, cfg, python, env, worker):
        self.cfg, self.python, self.env, self.worker = cfg, python, env, worker
        self.counter = 0

    def __call__(self, who, cache_dir, source, mode, plant=None, cc=None):
        self.counter += 1
        out = Path(self.cfg.tmp) / "reports" / f"{self.counter}.json"
        env = dict(self.env, TRITON_CACHE_DIR=str(cache_dir))
        if cc:
            env["CC"] = cc
        argv = [self.python, self.worker, "--out", out,
                "--source", source, "--name", "cuda_utils", mode]
        if plant:
            argv += ["--plant", plant]
        if who is None:
            run(argv, env=dict(os.environ, **env))
        else:
            who.run(argv, env=env)
        return json.loads(out.read_text())


def wait_counter(daemon, name, at_least, what, timeout=30.0):
    deadline = time.time() + timeout
    while True:
        got = daemon._raw_stats().get(name, 0)
        if got >= at_least or time.time() > deadline:
            C.check(got >= at_least, f"{what} ({name} {got}, want >= {at_least})",
                    daemon.stderr())
            return got
        time.sleep(0.2)


def scenario_users(cfg):
    if os.geteuid() != 0:
        raise Skip("needs root: it makes users with useradd and runs a mount as each")
    for tool in ("useradd", "userdel", "gcc"):
        if not shutil.which(tool):
            raise Skip(f"{tool} is not installed")
    fuse_mode = os.stat("/dev/fuse").st_mode
    users = []
    try:
        if fuse_mode & 0o006 != 0o006:
            # Debian's udev rule makes /dev/fuse 0666 so that users mount (libfuse
            # opens it itself before it tries fusermount3); some containers make it 0600.
            log("/dev/fuse is not open to users here: 0666 for this scenario, as on Debian")
            os.chmod("/dev/fuse", 0o666)
        _scenario_users(cfg, users)
    finally:
        compat.stop_all_daemons()
        for u in users:
            u.remove()
        os.chmod("/dev/fuse", stat.S_IMODE(fuse_mode))


def _scenario_users(cfg, users):
    tmp = Path(cfg.tmp)
    tmp.chmod(0o755)  # every user reaches the shared layer's socket and trust file
    (tmp / "reports").mkdir(mode=0o777)
    (tmp / "reports").chmod(0o1777)
    marks = tmp / "marks"
    marks.mkdir()
    marks.chmod(0o1777)
    python, py_env = user_python(cfg)
    os.environ["LD_LIBRARY_PATH"] = copy_for_users(cfg, tmp)
    worker = tmp / "launcher_worker.py"
    shutil.copy2(HERE / "workers" / "launcher_worker.py", worker)
    worker.chmod(0o644)
    triton = Triton(cfg, python, py_env, worker)
    alice, bob = (User(name, tmp) for name in USERS)
    users += [alice, bob]

    # The shared, trusted layer: a redis-server every user reaches, and a root-owned
    # trust file naming the producer's key (and only it).
    shared = tmp / "shared"
    shared.mkdir(mode=0o755)
    redis = RedisServer(shared / "redis", socket_perm="777")
    try:
        (shared / "redis").chmod(0o755)
        keys = shared / "producer-keys"
        run([cfg.kcache, "keys", "generate", "node", "--dir", keys])
        trust = shared / "trusted-keys"
        run([cfg.kcache, "keys", "trust", keys / "node.pub", "--name", "node",
             "--trust-file", trust])
        trust.chmod(0o644)
        alice.run([cfg.kcache, "keys", "generate", "alice"])  # hers, trusted by no one
        alice_key = alice.home / ".config" / "kcache" / "keys" / "alice.key"
        common = ["--remote", redis.url(), "--remote-trusted-keys", trust]

        producer = Daemon(cfg, tmp / "producer",
                          [*common, "--remote-signing-key", keys / "node.key"]).start()
        mine = UserDaemon(cfg, alice, tmp / "mnt-alice",
                          [*common, "--remote-signing-key", alice_key]).start()
        theirs = UserDaemon(cfg, bob, tmp / "mnt-bob", common).start()
        _check_users(cfg, tmp, triton, marks, alice, bob, producer, mine, theirs)
    finally:
        compat.stop_all_daemons()
        redis.stop()


def _check_users(cfg, tmp, triton, marks, alice, bob, producer, mine, theirs):
    a_cache, b_cache = mine.mnt / "triton", theirs.mnt / "triton"
    for u, d in ((alice, a_cache), (bob, b_cache)):
        u.run(["mkdir", "-p", d])
    sources = tmp / "sources"
    sources.mkdir(mode=0o755)

    # 1. alice plants a launcher under the key of bob's next module.
    C.where = "planted launcher"
    target = launcher_source(sources, "genuine-target")
    mark = marks / "planted-launcher-ran"
    hostile_c = launcher_source(sources, "planted", mark=mark)
    hostile = alice.home / "cuda_utils.so"
    include = run([triton.python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                  env=dict(os.environ, **triton.env)).stdout.strip()
    alice.run(["gcc", "-shared", "-fPIC", "-O2", f"-I{include}",
               hostile_c, "-o", hostile])
    planted = triton(alice, a_cache, target, "plant", plant=hostile)
    log(f"alice planted {planted['file']} under Triton's key {planted['key'][:16]}...")
    own = triton(alice, a_cache, target, "compile", cc="/bin/false")
    C.equal(own["who"], "planted", "the control: alice's own Triton loads what she planted")
    C.check(mark.exists(), "the control: the planted launcher's init ran in alice's process")
    mark.unlink(missing_ok=True)
    wait_counter(mine, "remote_uploads", 1, "alice's mount uploads her plant to the shared layer")

    got = triton(bob, b_cache, target, "compile")
    C.equal(got["who"], "genuine-target", "bob's Triton loads the module it compiled itself")
    C.check(not mark.exists(), "the planted launcher never ran in bob's process")
    wait_counter(theirs, "remote_rejected_untrusted", 1,
                 "bob's mount refused alice's entry as untrusted")
    why = theirs.kcache("why", f"triton/{planted['key']}", timeout=60)
    C.check("untrusted" in why.stdout, "kcache why names the refusal: untrusted",
            why.stdout + why.stderr)
    again = triton(bob, b_cache, target, "compile", cc="/bin/false")
    C.equal(again["who"], "genuine-target", "bob's next run hits his own module")

    # 2. alice cannot reach bob's mount or db.
    C.where = "isolation"
    probe = ("import os, sys\n"
             "for p in sys.argv[1:]:\n"
             "    try:\n"
             "        os.listdir(p); print(p, 'open')\n"
             "    except PermissionError:\n"
             "        print(p, 'EACCES')\n")
    r = alice.run([triton.python, "-c", probe, theirs.mnt, b_cache, theirs.db], check=False)
    C.equal(r.stdout.split(), [str(theirs.mnt), "EACCES", str(b_cache), "EACCES",
                               str(theirs.db), "EACCES"],
            "alice gets EACCES on bob's mount, inside it, and on his db")
    C.equal(stat.S_IMODE(os.stat(theirs.db).st_mode), 0o700, "bob's db is his alone (0700)")

    # 3. the trusted producer's kernels are everyone's.
    C.where = "trusted producer"
    shared_src = launcher_source(sources, "genuine-shared")
    made = triton(None, producer.mnt / "triton", shared_src, "compile")
    C.equal(made["who"], "genuine-shared", "the producer compiles the shared module")
    wait_counter(producer, "remote_uploads", 1, "the producer uploads it, signed")
    for u, cache in ((bob, b_cache), (alice, a_cache)):
        got = triton(u, cache, shared_src, "compile", cc="/bin/false")
        C.equal(got["who"], "genuine-shared",
                f"{u.name}'s Triton loads the producer's module without compiling")

    # 4. bob's own compile stays his.
    C.where = "own compiles"
    private_src = launcher_source(sources, "genuine-bob")
    uploads = theirs._raw_stats().get("remote_uploads", 0)
    got = triton(bob, b_cache, private_src, "compile")
    C.equal(got["who"], "genuine-bob", "bob compiles a module of his own")
    wait_counter(theirs, "remote_uploads", uploads + 1, "bob's mount uploads it, unsigned")
    seen = triton(alice, a_cache, private_src, "lookup")
    C.equal(seen["path"], None, "through alice's mount, bob's module is a miss")
    wait_counter(mine, "remote_rejected_unsigned", 1, "alice's mount refused it as unsigned")


if __name__ == "__main__":
    compat.SCENARIOS["users"] = (scenario_users, ["triton"])
    sys.exit(compat.main())
