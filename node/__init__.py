"""Server roles: storage (fragments on disk), control (metadata in RocksDB).

Owns the HTTP servers and their plumbing. Imports store and placement; must not be
imported by them.
"""
