FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY prq ./prq
COPY api ./api
RUN pip install --no-cache-dir '.[api]'
ENTRYPOINT ["prq"]
