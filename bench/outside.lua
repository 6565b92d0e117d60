-- wrk script of bench/outside.sh: pre-signed deliveries, each thread its own share of them, in
-- order (the repeats among them are the duplicates). One line of the file per delivery:
-- timestamp, tab, signature header, tab, body.
local threads = 0
local requests = {}
local next_request = 0

function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end

function init(args)
  local file, share, count = args[1], id, tonumber(args[2])
  local close = args[3] == "close"
  local index = 0
  for line in io.lines(file) do
    if index % count == share then
      local timestamp, signature, body = line:match("^([^\t]*)\t([^\t]*)\t(.*)$")
      local headers = {
        ["x-sume-webhook-timestamp"] = timestamp,
        ["x-sume-webhook-signature"] = signature,
        ["content-type"] = "application/json",
      }
      if close then headers["connection"] = "close" end
      requests[#requests + 1] = wrk.format("POST", args[4], headers, body)
    end
    index = index + 1
  end
end

function request()
  next_request = next_request % #requests + 1
  return requests[next_request]
end
