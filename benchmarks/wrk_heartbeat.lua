-- wrk script: POST /v1/heartbeat, cycling through pre-encoded msgpack bodies
-- (one per member) read from the file named by GROUPCOORD_BODIES: each body is
-- prefixed by its length as 2 bytes, big-endian. Written by server_heartbeat.py.
--
-- A response counts as a failure unless it is HTTP 200 with `error: nil`
-- (msgpack: fixstr "error" followed by 0xc0).
-- done() prints one machine-readable RESULT line.

local threads = {}
local next_thread = 0

function setup(thread)
  thread:set("offset", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

local function load(path)
  local f = assert(io.open(path, "rb"), "cannot open " .. tostring(path))
  local data = f:read("*a")
  f:close()
  local out, pos = {}, 1
  while pos <= #data do
    local hi, lo = data:byte(pos, pos + 1)
    local len = hi * 256 + lo
    out[#out + 1] = data:sub(pos + 2, pos + 1 + len)
    pos = pos + 2 + len
  end
  return out
end

local requests = {}
local counter = 0
failures = 0

function init(args)
  local headers = {["Content-Type"] = "application/msgpack"}
  for i, body in ipairs(load(os.getenv("GROUPCOORD_BODIES"))) do
    requests[i] = wrk.format("POST", "/v1/heartbeat", headers, body)
  end
  -- threads start at different members
  counter = (offset or 0) * 7919 % #requests
end

function request()
  counter = counter % #requests + 1
  return requests[counter]
end

local OK = "\165error\192"

function response(status, headers, body)
  if status ~= 200 or not body:find(OK, 1, true) then
    failures = failures + 1
  end
end

function done(summary, latency, requests)
  local failed = 0
  for _, t in ipairs(threads) do
    failed = failed + t:get("failures")
  end
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
    "socket_errors=%d failures=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, e.connect + e.read + e.write + e.timeout, failed))
end
