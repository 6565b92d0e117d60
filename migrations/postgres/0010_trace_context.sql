-- A job's W3C trace context (see migrations/sqlite/0010_trace_context.sql): the
-- `traceparent`, then the `tracestate` on a second line. NULL with tracing off.
ALTER TABLE jobs ADD COLUMN trace_context text;
