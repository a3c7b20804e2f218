"""The S3 gateway's protocol pieces: SigV4 authentication, request bodies (aws-chunked,
checksums), XML, and the error type every S3 handler raises.

Imports store and placement, never the storage or control node modules.
"""
