"""The inventory: which nodes exist, how to reach them, their NICs and GPUs.

All models are frozen and forbid unknown keys, so a typo in the YAML is an error
rather than a silently ignored setting. Cross-field rules (duplicate names, a data
subnet some node has no NIC in, ...) live in :func:`inventory_problems`, which
returns every problem with the path it belongs to, so the loader can point at the
right line of the file.
"""

from __future__ import annotations

import enum
import ipaddress
import sys
from collections.abc import Iterator
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from clusterrun.inventory.container import ContainerSettings, container_problems
from clusterrun.inventory.kinds import Transport
from clusterrun.inventory.run_settings import RunSettings, _Model
from clusterrun.inventory.types import (
    MAX_NODES,
    EnvName,
    EnvValue,
    GpuIndex,
    IfName,
    IpOrCidr,
    NodeName,
    Port,
    Rate,
    Text,
    brief_repr,
    check_rank_order,
    control_character_problem,
    format_path,
    labels_from_mapping,
)

Path = tuple[str | int, ...]

DEFAULT_MASTER_PORT = 29500




class NicKind(str, enum.Enum):
    ethernet = "ethernet"
    infiniband = "infiniband"
    roce = "roce"

    @property
    def is_rdma(self) -> bool:
        return self is not NicKind.ethernet


class HostKeyPolicy(str, enum.Enum):
    accept_new = "accept-new"  # like OpenSSH's StrictHostKeyChecking=accept-new
    strict = "strict"  # unknown hosts are refused
    off = "off"  # accept anything, record nothing (test rigs only)


class SshSettings(_Model):
    """How to reach a node over SSH. Unset fields fall back to ``~/.ssh/config``, then OpenSSH defaults."""

    user: Text | None = None
    port: Port | None = None
    identity_file: Text | None = Field(default=None, description="private key path; '~' is expanded")
    jump_host: Text | None = Field(default=None, description="ProxyJump: [user@]host[:port] or an ssh_config alias")
    config_file: Text | None = Field(default=None, description="ssh_config to read instead of ~/.ssh/config")
    known_hosts: Text | None = Field(default=None, description="known_hosts file (default ~/.ssh/known_hosts)")
    host_key_policy: HostKeyPolicy | None = None
    connect_timeout: Annotated[float, Field(gt=0, le=600, allow_inf_nan=False)] | None = None

    @field_validator("host_key_policy", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        # YAML 1.1 reads a bare `off` as false.
        return "off" if value is False else value

    def merged_over(self, base: SshSettings) -> SshSettings:
        """Values set here win over ``base``."""
        data = base.model_dump(exclude_none=True)
        data.update(self.model_dump(exclude_none=True))
        return SshSettings(**data)


class Nic(_Model):
    """One network interface of a node."""

    name: IfName
    ip: IpOrCidr | None = Field(default=None, description="address, optionally with prefix: 10.0.0.1/24")
    kind: NicKind = NicKind.ethernet
    hca: Text | None = Field(default=None, description="RDMA device for infiniband/roce NICs, e.g. mlx5_0")
    port: Annotated[int, Field(ge=1, le=16)] = Field(default=1, description="RDMA port of the HCA")
    gid_index: Annotated[int, Field(ge=0, le=255)] | None = Field(
        default=None, description="RoCE GID index (NCCL_IB_GID_INDEX); set only when you know it"
    )
    speed: Rate | None = None

    @property
    def address(self) -> str | None:
        return self.ip.split("/")[0] if self.ip else None

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        if not self.ip or "/" not in self.ip:
            return None
        return ipaddress.ip_interface(self.ip).network

    @model_validator(mode="after")
    def _rdma_needs_hca(self) -> Nic:
        if self.kind.is_rdma and not self.hca:
            raise PydanticCustomError(
                "missing_hca",
                "{kind} NICs need 'hca' (the RDMA device, e.g. mlx5_0; see `ibstat -l` or `ibdev2netdev`)",
                {"kind": self.kind.value},
            )
        if not self.kind.is_rdma and self.hca:
            raise PydanticCustomError(
                "hca_on_ethernet",
                "'hca' is set but kind is ethernet: set kind to 'roce' or 'infiniband', or remove 'hca'",
            )
        return self


class Defaults(_Model):
    """Settings every node inherits unless it overrides them."""

    ssh: SshSettings = SshSettings()
    transport: Transport = Transport.ssh
    python: Text | None = Field(
        default=None,
        description="interpreter on the nodes; torchrun runs as `<python> -m torch.distributed.run` "
        "(default: python3 over ssh, clusterrun's own interpreter for local nodes)",
    )
    workdir: Text | None = Field(default=None, description="directory the job runs in on each node (default: the run directory)")
    shared_fs: bool = Field(default=False, description="true when workdir is on a filesystem every node shares (no copying)")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    nproc_per_node: Annotated[int, Field(ge=1, le=1024)] | None = None
    container: ContainerSettings | None = Field(default=None, description="run the job inside this image")


class Network(_Model):
    """Which network carries training traffic."""

    data: str = Field(
        default="auto",
        description="'auto', a NIC name present on every node (eth1), or a subnet (10.0.0.0/24)",
    )
    master_port: Port = Field(DEFAULT_MASTER_PORT, description="unset: 29500 or the next free one on the master")
    rank_order: str = Field(default="inventory", description="node ranks in inventory order, or 'label:KEY': nodes "
                            "whose KEY=VALUE label shares a value (switch, rack) get consecutive ranks")

    _rank_order_choice = field_validator("rank_order")(lambda cls, v: check_rank_order(v))

    @field_validator("data")
    @classmethod
    def _data_choice(cls, value: str) -> str:
        problem = control_character_problem(value)
        if problem:
            raise ValueError(f"the text {problem}")
        value = value.strip()
        if value == "auto":
            return value
        if "/" in value:
            try:
                return str(ipaddress.ip_network(value, strict=False))
            except ValueError:
                raise ValueError(f"expected 'auto', a NIC name or a subnet like '10.0.0.0/24', got {value!r}") from None
        from clusterrun.inventory.types import _check_ifname

        return _check_ifname(value)

    @property
    def data_subnet(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        return ipaddress.ip_network(self.data) if "/" in self.data else None


def _gpus_from_count(value: object) -> object:
    # `gpus: 8` means indices 0..7; a list is taken as given.
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0 or value > 1024:
            raise ValueError(f"expected a GPU count between 0 and 1024 or a list of indices, got {brief_repr(value)}")
        return list(range(value))
    return value


class Node(_Model):
    """One machine of the cluster."""

    name: NodeName
    host: str = Field(description="how SSH reaches the node: address, name or ~/.ssh/config alias")
    transport: Transport | None = None
    ssh: SshSettings = SshSettings()
    python: Text | None = None
    workdir: Text | None = None
    gpus: list[GpuIndex] = Field(default_factory=list, max_length=1024,
                                 description="GPU indices, or a count (8 = 0..7)")
    nproc_per_node: Annotated[int, Field(ge=1, le=1024)] | None = None
    nics: list[Nic] = Field(default_factory=list)
    labels: list[Text] = Field(default_factory=list, description="tags; KEY=VALUE ones (or a mapping) order ranks")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    node_rank: Annotated[int, Field(ge=0, le=MAX_NODES - 1)] | None = Field(
        default=None, description="pin this node's rank")
    spare: bool = Field(default=False, description="takes no part until a node is lost, then takes its place "
                                                   "(with up --max-restarts)")
    container: ContainerSettings | None = Field(default=None, description="over defaults.container, key by key")

    _coerce_gpus = field_validator("gpus", mode="before", json_schema_input_type=list[int] | int)(
        lambda cls, v: _gpus_from_count(v))
    _coerce_labels = field_validator("labels", mode="before", json_schema_input_type=list[str] | dict[str, str])(
        lambda cls, v: labels_from_mapping(v))

    def label(self, key: str) -> str | None:
        """The value of this node's ``KEY=VALUE`` label, or None."""
        return next((tag.split("=", 1)[1] for tag in self.labels if tag.startswith(key + "=")), None)

    @field_validator("host")
    @classmethod
    def _host_not_blank(cls, value: str) -> str:
        problem = control_character_problem(value)
        if problem:
            raise ValueError(f"the host {problem}")
        if not value.strip() or any(c.isspace() for c in value.strip()):
            raise ValueError(f"expected a host name or address without spaces, got {brief_repr(value)}")
        return value.strip()

    def nic_named(self, name: str) -> Nic | None:
        return next((nic for nic in self.nics if nic.name == name), None)

    def nic_in(self, subnet: ipaddress.IPv4Network | ipaddress.IPv6Network) -> Nic | None:
        for nic in self.nics:
            if nic.address and ipaddress.ip_address(nic.address) in subnet:
                return nic
        return None


class Inventory(_Model):
    """The whole inventory file."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"title": "clusterrun inventory"})

    version: Literal[1] = 1
    defaults: Defaults = Defaults()
    network: Network = Network()
    run: RunSettings = RunSettings()
    nodes: list[Node] = Field(max_length=MAX_NODES)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Inventory:
        problems = list(inventory_problems(self))
        if problems:
            raise PydanticCustomError(
                "inventory_rules",
                "{summary}",
                {"summary": "; ".join(f"{format_path(p)}: {m}" for p, m in problems), "problems": problems},
            )
        return self

    def node(self, name: str) -> Node:
        """The node called ``name``. Raises KeyError for a name the inventory does not have."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def transport_of(self, node: Node) -> Transport:
        return node.transport or self.defaults.transport

    def python_of(self, node: Node) -> str:
        explicit = node.python or self.defaults.python
        if explicit:
            return explicit
        # A local node runs where clusterrun runs: its interpreter has torch when `clusterrun[torch]` was installed.
        return sys.executable if self.transport_of(node) is Transport.local else "python3"

    def workdir_of(self, node: Node) -> str | None:
        return node.workdir or self.defaults.workdir

    def ssh_of(self, node: Node) -> SshSettings:
        return node.ssh.merged_over(self.defaults.ssh)

    def container_of(self, node: Node) -> ContainerSettings | None:
        """The node's container settings (its own over the defaults), or None: the job runs on the host."""
        return node.container.merged_over(self.defaults.container) if node.container else self.defaults.container


def inventory_problems(inv: Inventory) -> Iterator[tuple[Path, str]]:
    """Yield ``(path, message)`` for every cross-field rule the inventory breaks."""
    if not inv.nodes:
        yield ("nodes",), "the node list is empty: list at least one node"
        return
    seen_names: dict[str, int] = {}
    seen_hosts: dict[tuple[str, int | None], int] = {}
    for i, node in enumerate(inv.nodes):
        if node.name in seen_names:
            yield ("nodes", i, "name"), f"duplicate node name {node.name!r} (also nodes[{seen_names[node.name]}])"
        seen_names.setdefault(node.name, i)
        port = inv.ssh_of(node).port
        key = (node.host, port)
        if inv.transport_of(node) is Transport.ssh and key in seen_hosts:
            yield (
                ("nodes", i, "host"),
                f"duplicate host {node.host!r} (also nodes[{seen_hosts[key]}]); each node must be a different machine"
                " (or a different ssh port)",
            )
        seen_hosts.setdefault(key, i)
        yield from _node_problems(i, node)
    yield from container_problems([node.container for node in inv.nodes], inv.defaults.container)
    yield from _rank_problems(inv)
    yield from _network_problems(inv)


def _node_problems(i: int, node: Node) -> Iterator[tuple[Path, str]]:
    seen_gpu: set[int] = set()
    for j, gpu in enumerate(node.gpus):
        if gpu in seen_gpu:
            yield ("nodes", i, "gpus", j), f"GPU index {gpu} is listed twice"
        seen_gpu.add(gpu)
    seen_nic: dict[str, int] = {}
    seen_hca: dict[tuple[str, int], int] = {}
    for j, nic in enumerate(node.nics):
        if nic.name in seen_nic:
            yield ("nodes", i, "nics", j, "name"), f"NIC {nic.name!r} is listed twice (also nics[{seen_nic[nic.name]}])"
        seen_nic.setdefault(nic.name, j)
        if nic.hca:
            hk = (nic.hca, nic.port)
            if hk in seen_hca:
                yield ("nodes", i, "nics", j, "hca"), f"{nic.hca} port {nic.port} is listed twice"
            seen_hca.setdefault(hk, j)


def _rank_problems(inv: Inventory) -> Iterator[tuple[Path, str]]:
    pinned = [(i, n.node_rank) for i, n in enumerate(inv.nodes) if n.node_rank is not None]
    if not pinned:
        return
    if len(pinned) != len(inv.nodes):
        i = next(i for i, n in enumerate(inv.nodes) if n.node_rank is None)
        yield ("nodes", i, "node_rank"), "node_rank is pinned on some nodes but not this one: pin all or none"
        return
    seen: dict[int, int] = {}
    for i, rank in pinned:
        assert rank is not None
        if rank >= len(inv.nodes):
            yield ("nodes", i, "node_rank"), f"node_rank {rank} is out of range: {len(inv.nodes)} nodes means 0..{len(inv.nodes) - 1}"
        elif rank in seen:
            yield ("nodes", i, "node_rank"), f"node_rank {rank} is also pinned on nodes[{seen[rank]}]"
        seen.setdefault(rank, i)


def _network_problems(inv: Inventory) -> Iterator[tuple[Path, str]]:
    choice = inv.network.data
    if choice == "auto" or len(inv.nodes) == 0:
        return
    subnet = inv.network.data_subnet
    for i, node in enumerate(inv.nodes):
        if subnet is not None:
            if node.nics and node.nic_in(subnet) is None:
                have = ", ".join(f"{n.name} {n.ip}" for n in node.nics if n.ip) or "no addresses"
                yield (
                    ("nodes", i, "nics"),
                    f"node {node.name!r} has no NIC in the data subnet {choice} (it has: {have}); "
                    "add the NIC with its address or choose another network.data",
                )
        elif node.nics and node.nic_named(choice) is None:
            names = ", ".join(n.name for n in node.nics)
            yield (
                ("nodes", i, "nics"),
                f"node {node.name!r} has no NIC named {choice!r} (it has: {names}); NIC names often differ between "
                "machines: set network.data to the subnet instead, e.g. 10.0.0.0/24",
            )


def inventory_json_schema() -> dict[str, object]:
    """The JSON Schema of the inventory file (what `clusterrun schema` prints)."""
    schema = Inventory.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
