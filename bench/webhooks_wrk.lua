-- wrk script for `python -m bench webhooks` (see bench/webhooks.py).
--
-- The bench writes the notice stream (one JSON body per line; its duplicates already mixed in)
-- into one file per wrk thread: $SPOTPIPE_WRK_STREAM_DIR/stream-<n>.txt. Each thread sends its
-- file's bodies in order over keep-alive connections, exactly once each, then stops. A connection
-- that asks for a request after the thread's file is used up gets a cheap filler (the parse-only
-- route, answered {"status": "parsed"} and not counted), so every counted request is answered
-- before the thread stops. The burst lasts from a thread's first request to the last thread's
-- last answer (CLOCK_MONOTONIC through LuaJIT's FFI). done() prints one line "WRK_RESULT <json>" with the counts and the
-- latency percentiles of the whole run, in microseconds.

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } spotpipe_timespec;
  int clock_gettime(int clk_id, spotpipe_timespec *tp);
]]
local CLOCK_MONOTONIC = 1

local function now_us()
  local ts = ffi.new("spotpipe_timespec")
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1e6 + tonumber(ts.tv_nsec) / 1e3
end

local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("thread_no", counter)
  table.insert(threads, thread)
end

-- Globals (not locals): done() reads them through thread:get().
requests = {}
filler = nil
sent, answered, fillers = 0, 0, 0
statuses = {}
count_parsed = false
probed = false
first_us, last_us, last_sent_us, last_answer_us = 0, 0, 0, 0
STALL_US = 12e6 -- longer than wrk's --timeout

function init(args)
  local dir = os.getenv("SPOTPIPE_WRK_STREAM_DIR")
  local path = os.getenv("SPOTPIPE_WRK_PATH")
  local key = os.getenv("SPOTPIPE_WRK_API_KEY")
  local headers = { ["Content-Type"] = "application/json", ["x-api-key"] = key }
  for line in io.lines(dir .. "/stream-" .. thread_no .. ".txt") do
    table.insert(requests, wrk.format("POST", path, headers, line))
  end
  count_parsed = os.getenv("SPOTPIPE_WRK_COUNT_PARSED") == "1"
  filler = wrk.format("POST", os.getenv("SPOTPIPE_WRK_FILLER_PATH"), headers, '{"filler": true}')
end

function request()
  if not probed then
    -- wrk calls request() once on its first thread before the run, to check the script (and
    -- never sends that one): hand it a filler so that no notice of the stream is lost to it.
    probed = true
    return filler
  end
  if sent < #requests then
    if sent == 0 then
      first_us = now_us()
    end
    sent = sent + 1
    last_sent_us = now_us()
    return requests[sent]
  end
  fillers = fillers + 1
  return filler
end

function delay()
  -- Fillers only keep a connection busy until the thread's last answers are in: send them slowly.
  if sent >= #requests then
    return 20
  end
  return 0
end

local function finish()
  last_us = last_answer_us
  -- wrk itself runs for its whole -d: tell the bench this thread is through (it then sends SIGINT)
  local marker = io.open(os.getenv("SPOTPIPE_WRK_STREAM_DIR") .. "/done-" .. thread_no, "w")
  marker:write("done\n")
  marker:close()
  wrk.thread:stop()
end

function response(status, headers, body)
  if not count_parsed and body ~= nil and string.find(body, '"parsed"', 1, true) then
    -- a filler's answer: the ingest variants' own requests never reach the parse-only route.
    -- A request wrk gave up on (a timeout or a closed connection) never gets an answer, so a
    -- thread whose last request went out STALL_US ago stops with it unanswered.
    if sent >= #requests and now_us() - last_sent_us > STALL_US then
      finish()
    end
    return
  end
  answered = answered + 1
  last_answer_us = now_us()
  statuses[status] = (statuses[status] or 0) + 1
  if answered == #requests then
    finish()
  end
end

function done(summary, latency, requests_)
  local total_sent, total_answered, total_fillers = 0, 0, 0
  local start_us, end_us = nil, 0
  local merged = {}
  for _, thread in ipairs(threads) do
    total_sent = total_sent + thread:get("sent")
    total_answered = total_answered + thread:get("answered")
    total_fillers = total_fillers + thread:get("fillers")
    local first, last = thread:get("first_us"), thread:get("last_us")
    if first > 0 and (start_us == nil or first < start_us) then
      start_us = first
    end
    if last > end_us then
      end_us = last
    end
    for code, n in pairs(thread:get("statuses")) do
      merged[tostring(code)] = (merged[tostring(code)] or 0) + n
    end
  end
  local per_thread = {}
  for _, thread in ipairs(threads) do
    table.insert(per_thread, string.format('{"planned": %d, "sent": %d, "answered": %d}',
      #thread:get("requests"), thread:get("sent"), thread:get("answered")))
  end
  local parts = {}
  for code, n in pairs(merged) do
    table.insert(parts, string.format('"%s": %d', code, n))
  end
  io.write(string.format(
    'WRK_RESULT {"sent": %d, "answered": %d, "fillers": %d, "burst_us": %d, "duration_us": %d, "responses": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "max": %d, "mean": %.1f}, "statuses": {%s}, ' ..
    '"threads": [%s]}\n',
    total_sent, total_answered, total_fillers, end_us - (start_us or end_us), summary.duration, summary.requests,
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.status,
    summary.errors.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean, table.concat(parts, ", "), table.concat(per_thread, ", ")))
end
