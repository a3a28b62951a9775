# prq with the admin service: `prq <command>` (see docker-compose.yml).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY prq ./prq
COPY api ./api
RUN pip install '.[api]' \
    && useradd --system --create-home --uid 10001 prq
USER prq
ENTRYPOINT ["prq"]
CMD ["--help"]
