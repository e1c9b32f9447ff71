"""replag: replication lag and anti-entropy for Redis replicated across racks and regions."""

from replag.config import Config, load_config
from replag.errors import ReplagError
from replag.topology import Endpoint, Region, ReplicaGroup, Topology

__all__ = ["Config", "Endpoint", "Region", "ReplagError", "ReplicaGroup", "Topology", "load_config"]
__version__ = "0.1.0"
