# stepguard services image: every service is `stepguard <service>`.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY detectors ./detectors
COPY pipeline ./pipeline
RUN pip install --no-cache-dir . && useradd --system --uid 10001 stepguard
USER stepguard
ENTRYPOINT ["stepguard"]
CMD ["--help"]
