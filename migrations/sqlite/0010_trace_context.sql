-- A job's W3C trace context, kept from its delivery so that each attempt joins (or, a retry,
-- links to) its trace, also after a restart: the `traceparent`, then the `tracestate` on a
-- second line when there is one. NULL with tracing off, and for jobs claimed before.
ALTER TABLE jobs ADD COLUMN trace_context TEXT;
