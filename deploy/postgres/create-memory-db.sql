-- Runs once, when the PostgreSQL volume is first initialised (docker-entrypoint-initdb.d).
-- POSTGRES_DB creates the ops database; research memory gets its own database beside it, so it
-- can be dumped, restored and kept on its own (DESIGN.md, "Two stores").
CREATE DATABASE autopilot_memory;
