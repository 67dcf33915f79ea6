"""Pure parsers of what hosts report, on recorded outputs (tests/unit/data/check/).

Recorded in the lab: /proc/net/tcp and tcp6 (a host with listeners on 17001 and [::]:17002
and an ssh session), `ip -o addr show`, torch's version.py (a CPU wheel). Written in the
exact formats of the real tools, since the lab has no GPU: nvidia-smi CSV (A100 and V100
machines, a busy GPU, [N/A] fields), torch and paddle version files of CUDA builds, and
`ip -o addr` of a machine with a secondary address, InfiniBand and a VLAN.
"""
from pathlib import Path

import pytest

from multihost.check.parsers import (fold_ranges, gib, nccl_code, nccl_from_dists, parse_gpu_apps,
                                     parse_gpus, parse_paddle_version, parse_software,
                                     parse_torch_version)
from multihost.remote.check.proc import parse_proc_net_tcp
from multihost.remote.check.net import (iface_by_route, interface_of, parse_ip_addr,
                                            parse_proc_net_route)

DATA = Path(__file__).resolve().parents[1] / "data" / "check"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_nvidia_smi_gpus():
    gpus = parse_gpus(read("nvidia-smi-gpus-a100x8.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].name == "NVIDIA A100-SXM4-80GB" and gpus[0].memory_mib == 81920
    assert gpus[2].used_mib == 30721 and gpus[0].driver == "535.104.05"
    assert gpus[7].uuid.endswith("4e57")


def test_nvidia_smi_not_available_fields_do_not_break_the_row():
    gpus = parse_gpus(read("nvidia-smi-gpus-v100x4.csv"))
    assert len(gpus) == 4
    assert gpus[2].memory_mib is None and gpus[2].used_mib is None
    assert gpus[2].name == "Tesla V100-SXM2-32GB"


def test_nvidia_smi_name_with_a_comma():
    gpus = parse_gpus("0, Some GPU, Rev 2, 16384, 0, 550.54, GPU-abc\n")
    assert gpus[0].name == "Some GPU, Rev 2" and gpus[0].memory_mib == 16384
    assert gpus[0].uuid == "GPU-abc"


def test_nvidia_smi_apps():
    apps = parse_gpu_apps(read("nvidia-smi-apps.csv"))
    assert len(apps) == 1
    assert apps[0].pid == 48213 and apps[0].name == "/opt/conda/bin/python"
    assert apps[0].used_mib == 30716 and apps[0].uuid.endswith("4e52")
    assert parse_gpu_apps("") == ()


def test_torch_version_files():
    assert parse_torch_version(read("torch-version-cpu.py.txt")) == ("2.13.0+cpu", None)
    assert parse_torch_version(read("torch-version-cu121.py.txt")) == ("2.4.1+cu121", "12.1")


def test_paddle_version_files():
    assert parse_paddle_version(read("paddle-version-cpu.py.txt")) == ("3.3.0", None, None)
    assert parse_paddle_version(read("paddle-version-gpu.py.txt")) == ("2.6.1", "12.0", "2.18.4")


@pytest.mark.parametrize("code,version", [("21804", "2.18.4"), ("2708", "2.7.8"),
                                          ("22103", "2.21.3"), ("0", None), ("", None)])
def test_nccl_version_codes(code, version):
    assert nccl_code(code) == version


def test_nccl_from_pip_metadata():
    names = ["torch-2.4.1.dist-info", "nvidia_nccl_cu12-2.20.5.dist-info"]
    assert nccl_from_dists(names) == "2.20.5"
    assert nccl_from_dists(["torch-2.4.1.dist-info"]) is None


def test_software_from_a_probe_reply():
    probe = {"version": "3.10.12", "executable": "/opt/venv/bin/python",
             "torch": {"path": "/x/torch", "version_py": read("torch-version-cu121.py.txt")},
             "dists": ["nvidia_nccl_cu12-2.20.5.dist-info"]}
    sw = parse_software(probe)
    assert (sw.torch, sw.torch_cuda, sw.nccl, sw.paddle) == ("2.4.1+cu121", "12.1", "2.20.5", None)
    assert sw.describe() == "Python 3.10.12, torch 2.4.1+cu121 (CUDA 12.1, NCCL 2.20.5)"
    bare = parse_software({"version": "3.11.2", "executable": "/usr/bin/python3"})
    assert bare.torch is None and bare.describe() == "Python 3.11.2"


def test_proc_net_tcp_recorded_in_the_lab():
    entries = parse_proc_net_tcp(read("proc-net-tcp.txt"))
    listening = {(port, inode) for port, state, inode in entries if state == "0A"}
    assert (17001, 128663) in listening and (22, 13959) in listening
    assert (22, "01", 129206) in entries  # the ssh session, not a listener
    six = parse_proc_net_tcp(read("proc-net-tcp6.txt"))
    assert six == [(17002, "0A", 128664)]


def test_ip_addr_recorded_in_the_lab():
    table = parse_ip_addr(read("ip-addr-lab.txt"))
    assert table["eth0"][0] == "198.18.0.12" and table["lo"][0] == "127.0.0.1"
    assert interface_of("198.18.0.12", table) == "eth0"


def test_ip_addr_secondary_infiniband_and_vlan():
    table = parse_ip_addr(read("ip-addr-multi.txt"))
    assert interface_of("10.20.9.5", table) == "enp65s0f0"  # a secondary address
    assert interface_of("192.168.100.5", table) == "ib0"
    assert interface_of("172.16.20.5", table) == "bond0.20"  # "@bond0" is not the name
    assert interface_of("10.9.9.9", table) is None


def test_route_table_recorded_in_the_lab():
    routes = parse_proc_net_route(read("proc-net-route-lab.txt"))
    assert iface_by_route("198.18.0.12", routes) == "eth0"
    assert iface_by_route("10.0.0.1", routes) is None


def test_route_table_picks_the_connected_network_never_the_default_route():
    routes = parse_proc_net_route(read("proc-net-route-multi.txt"))
    assert iface_by_route("10.20.9.5", routes) == "enp65s0f0"
    assert iface_by_route("192.168.100.5", routes) == "ib0"
    assert iface_by_route("172.16.0.9", routes) is None  # only the default route: not ours


def test_small_formatters():
    assert fold_ranges([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    assert fold_ranges([]) == ""
    assert gib(3 * 2 ** 30) == "3.0 GiB" and gib(412 * 2 ** 30) == "412 GiB"
