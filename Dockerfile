# stepguard services image: every service is `stepguard <service>`.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY detectors ./detectors
COPY pipeline ./pipeline
RUN pip install --no-cache-dir . && useradd --system --uid 10001 stepguard
USER stepguard
# inside a container the metrics endpoints listen on every interface (a scraper in
# another container reaches them); outside one the default is loopback
ENV STEPGUARD_METRICS_BIND_ADDRESS=0.0.0.0
ENTRYPOINT ["stepguard"]
CMD ["--help"]
