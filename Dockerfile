# ragrank's image: `ragrank serve` by default, `ragrank worker` for the indexer.
#   docker build -t ragrank:cpu .                            CPU torch and OpenVINO (small)
#   docker build -t ragrank:cuda --build-arg VARIANT=cuda .  CUDA torch and faiss-gpu (GPU; needs
#                                                            the NVIDIA container toolkit on the host)
# Two stages: `build` installs torch and ragrank into a virtualenv; `runtime` copies only that
# virtualenv onto a clean Python image and runs as an unprivileged user.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
# PyPI's Linux torch wheels are the CUDA build (with CUDA's libraries as pip packages; the
# driver comes from the host); PyTorch's CPU index has the CPU-only build.
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_CUDA_INDEX=https://pypi.org/simple
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
# The versions the test suite passed with, for torch's dependencies as for ragrank's.
COPY constraints.txt ./
RUN case "${VARIANT}" in \
      cpu) index="${TORCH_CPU_INDEX}" ;; \
      cuda) index="${TORCH_CUDA_INDEX}" ;; \
      *) echo "VARIANT must be cpu or cuda, not '${VARIANT}'" >&2; exit 1 ;; \
    esac \
    && pip install -c constraints.txt "torch==${TORCH_VERSION}" --index-url "${index}" \
       --extra-index-url https://pypi.org/simple
COPY pyproject.toml README.md ./
COPY ragrank ragrank
COPY server server
COPY indexing indexing
COPY eval eval
COPY cli cli
# The CUDA image also carries `ragrank eval` with faiss's GPU build (the `gpu` extra); the CPU
# image is the server and the worker with OpenVINO (the `openvino` extra), which the `small`
# preset's `auto` backends run on a CPU.
RUN case "${VARIANT}" in \
      cpu) target=".[openvino]" ;; \
      cuda) target=".[gpu]" ;; \
    esac \
    && pip install -c constraints.txt "${target}"

FROM python:${PYTHON_VERSION}-slim AS runtime
ARG VARIANT=cpu
LABEL org.opencontainers.image.title="ragrank" \
      org.opencontainers.image.description="Retrieval and cross-encoder reranking server for RAG" \
      org.opencontainers.image.licenses="Apache-2.0" \
      ai.ragrank.variant="${VARIANT}"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/models \
    RAGRANK_OPENVINO_CACHE=/models/openvino \
    RAGRANK_HOST=0.0.0.0 \
    RAGRANK_JOBS_PATH=/data/jobs.sqlite3 \
    RAGRANK_QDRANT_PATH=/data/qdrant
COPY --from=build /opt/venv /opt/venv
RUN useradd --create-home --uid 1000 --user-group ragrank \
    && mkdir -p /models /data /documents \
    && chown ragrank:ragrank /models /data
USER 1000:1000
WORKDIR /home/ragrank
EXPOSE 8000
ENTRYPOINT ["ragrank"]
CMD ["serve"]
