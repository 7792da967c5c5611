"""Local DynamoDB-compatible servers and a fault proxy, for the tests, the benchmarks and the demo.

Not part of the shipped package: ``servers`` starts AWS's DynamoDB Local, dynalite and
moto server on loopback; ``atomic_moto`` is moto's server with each request serialised
(as DynamoDB applies conditional writes); ``faultproxy`` sits between a client and a
server and delays, drops, duplicates or fails requests and replies on command.
Both ``tests/`` and ``bench/`` import it; neither imports the other.
"""
