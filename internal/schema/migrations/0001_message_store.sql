-- The event store: MessageDB's (github.com/message-db/message-db) table,
-- indexes and the functions of it that the host uses, with MessageDB's
-- names and signatures, so that a database that already holds MessageDB is
-- adopted as it is and MessageDB tooling can read ours.

CREATE SCHEMA IF NOT EXISTS message_store;

CREATE TABLE IF NOT EXISTS message_store.messages (
  global_position bigserial NOT NULL,
  position bigint NOT NULL,
  time timestamp without time zone DEFAULT (now() AT TIME ZONE 'utc') NOT NULL,
  stream_name text NOT NULL,
  type text NOT NULL,
  data jsonb,
  metadata jsonb,
  id uuid NOT NULL DEFAULT gen_random_uuid(),
  CONSTRAINT messages_pkey PRIMARY KEY (global_position)
);

-- The part of a stream name before the first '-'. SQL rather than
-- MessageDB's PL/pgSQL, so that the planner inlines it (same result).
CREATE OR REPLACE FUNCTION message_store.category(stream_name varchar)
RETURNS varchar
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT split_part($1, '-', 1) $$;

-- MessageDB's advisory-lock key for a name.
CREATE OR REPLACE FUNCTION message_store.hash_64(value varchar)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT left('x' || md5($1), 17)::bit(64)::bigint $$;

CREATE UNIQUE INDEX IF NOT EXISTS messages_id ON message_store.messages (id);
CREATE UNIQUE INDEX IF NOT EXISTS messages_stream ON message_store.messages (stream_name, position);
CREATE INDEX IF NOT EXISTS messages_category ON message_store.messages (
  message_store.category(stream_name),
  global_position,
  message_store.category(metadata->>'correlationStreamName')
);

CREATE OR REPLACE FUNCTION message_store.acquire_lock(stream_name varchar)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  _category_name_hash bigint;
BEGIN
  _category_name_hash := message_store.hash_64(message_store.category(acquire_lock.stream_name));
  PERFORM pg_advisory_xact_lock(_category_name_hash);
  RETURN _category_name_hash;
END;
$$;

CREATE OR REPLACE FUNCTION message_store.stream_version(stream_name varchar)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  _stream_version bigint;
BEGIN
  SELECT max(position) INTO _stream_version
  FROM message_store.messages
  WHERE messages.stream_name = stream_version.stream_name;
  RETURN _stream_version;
END;
$$;

-- MessageDB's write_message: takes the stream's category lock (held until
-- commit, so appends to one category commit in global_position order with
-- no gap between them), checks the expected version (NULL: no check, -1:
-- no stream yet) and appends at the next position, which it returns.
CREATE OR REPLACE FUNCTION message_store.write_message(
  id varchar,
  stream_name varchar,
  "type" varchar,
  data jsonb,
  metadata jsonb DEFAULT NULL,
  expected_version bigint DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
  _message_id uuid;
  _stream_version bigint;
  _next_position bigint;
BEGIN
  PERFORM message_store.acquire_lock(write_message.stream_name);

  _stream_version := message_store.stream_version(write_message.stream_name);
  IF _stream_version IS NULL THEN
    _stream_version := -1;
  END IF;

  IF write_message.expected_version IS NOT NULL THEN
    IF write_message.expected_version != _stream_version THEN
      RAISE EXCEPTION
        'Wrong expected version: % (Stream: %, Stream Version: %)',
        write_message.expected_version,
        write_message.stream_name,
        _stream_version;
    END IF;
  END IF;

  _next_position := _stream_version + 1;
  _message_id := uuid(write_message.id);

  INSERT INTO message_store.messages (id, stream_name, position, type, data, metadata)
  VALUES (_message_id, write_message.stream_name, _next_position, write_message.type,
          write_message.data, write_message.metadata);

  RETURN _next_position;
END;
$$;
