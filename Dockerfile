# One image for every ecstore role: docker-compose.yml picks control node, storage node,
# S3 gateway or `ecstore cluster bootstrap` with each service's command (there is no
# ENTRYPOINT, so a service's command is its whole argv).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The dependencies first, in a layer of their own: editing the code does not reinstall
# them. Every one ships manylinux wheels (pyeclib bundles liberasurecode and ISA-L), so
# the slim image needs no compiler.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The package itself (this installs the `ecstore` console script).
COPY placement ./placement
COPY store ./store
COPY node ./node
COPY cli ./cli
RUN pip install --no-deps . && python -m compileall -q /app

# Not root. /data is each node's data directory: docker-compose.yml mounts a named volume
# there, and Docker initialises an empty named volume with this directory's owner.
RUN useradd --system --uid 10001 --user-group --home-dir /data --no-create-home ecstore \
    && mkdir -p /data && chown ecstore:ecstore /data
USER ecstore

# control nodes, storage nodes, S3 gateway (documentation: docker-compose.yml publishes
# only the gateway's port)
EXPOSE 7100 7200 9000
CMD ["ecstore", "--help"]
