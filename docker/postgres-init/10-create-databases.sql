-- Runs once, when the postgres container starts on an empty data volume (docker-entrypoint-initdb.d),
-- as $POSTGRES_USER connected to $POSTGRES_DB (the specdec history store).
-- MLflow and Prefect each get their own database: MLflow and the history store both keep their
-- schema version in an `alembic_version` table, so they must never share a database.
CREATE DATABASE mlflow;
CREATE DATABASE prefect;
