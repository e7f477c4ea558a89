# syntax=docker/dockerfile:1
# The ckpt service image: one image for every process (`ckpt api`, `scheduler`, `worker`,
# `migrate`), chosen by the command. Build: docker build -t ckpt-lifecycle .

# Both stages use the same base: the virtualenv built in the first one links to its Python.
ARG PYTHON_IMAGE=python:3.11-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /opt/ckpt

# Dependencies in a layer of their own, rebuilt only when pyproject.toml changes: install
# the project with an empty package, then drop it and keep what it pulled in. Every
# dependency ships wheels, so no compiler is needed here either.
COPY pyproject.toml README.md ./
RUN mkdir app && touch app/__init__.py \
    && pip install --no-cache-dir . \
    && pip uninstall --yes ckpt-lifecycle \
    && rm -rf app build ./*.egg-info

COPY app ./app
COPY migrations ./migrations
COPY policies ./policies
# Editable on purpose: the migrations are found beside the package (app/db/migrate.py looks
# for ../../migrations), so the source tree stays at /opt/ckpt, where it is installed.
# Compiled now because the service user cannot write __pycache__ at run time.
RUN pip install --no-cache-dir --no-deps --editable . \
    && python -m compileall -q app migrations


FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CKPT_HOST=0.0.0.0 \
    CKPT_PORT=8000 \
    CKPT_POLICIES_DIR=/opt/ckpt/policies \
    CKPT_DATA_DIR=/var/lib/ckpt/data

# A fixed numeric id, so Kubernetes' runAsNonRoot can check it without a passwd lookup.
RUN groupadd --system --gid 10001 ckpt \
    && useradd --system --uid 10001 --gid ckpt --home-dir /var/lib/ckpt --create-home \
       --shell /usr/sbin/nologin ckpt

COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/ckpt /opt/ckpt

# The working directory is the only place the service user may write: the embedded
# default (`ckpt serve`, SQLite and local tiers) keeps its ./var there.
WORKDIR /var/lib/ckpt
USER 10001:10001
EXPOSE 8000

# Only `ckpt api` and `ckpt serve` answer /healthz: compose turns the check off for the
# scheduler and workers, and Kubernetes ignores it in favour of the pods' probes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CKPT_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["ckpt"]
CMD ["api"]
