# ragrank on the CPU. (A CUDA variant and a multi-stage build come with the full compose stack.)
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HOME=/models

RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY ragrank ragrank
COPY server server
COPY indexing indexing
COPY eval eval
RUN pip install . && useradd --create-home --uid 1000 ragrank && mkdir -p /models /data \
    && chown ragrank /models /data
USER ragrank

EXPOSE 8000
ENTRYPOINT ["ragrank"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
