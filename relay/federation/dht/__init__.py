"""The stations' Kademlia DHT: the node, its protocol, storage and checks."""
