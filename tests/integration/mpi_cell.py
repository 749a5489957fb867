"""What the cell tests share: the mpiexec to use, its flags for a small box, the environment (root allowed, one
OpenMP thread per rank), and finding and watching the rank processes mpiexec started."""
import os
import shutil

MPIEXEC = os.environ.get("KESTREL_MPIEXEC") or shutil.which("mpiexec")
# The flags of the MPI unit tests (tests/unit/dist/CMakeLists.txt): oversubscribed ranks that yield when idle,
# no cross-memory attach (refused in many containers), one OpenMP thread per rank.
MPI_FLAGS = ["--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_vader_single_copy_mechanism",
             "none", "-x", "OMP_NUM_THREADS=1"]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")


def rank_pids(mpirun_pid):
    """The kestrel processes mpirun started, by their OMPI_COMM_WORLD_RANK."""
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{p}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"OMPI_COMM_WORLD_RANK" in env:
                out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(p)
        except (OSError, ValueError, IndexError):
            continue
    return out


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rfind(")") + 2] != "Z"
    except OSError:
        return False
