"""The Lua scripts of the Redis store: one atomic script per operation, one key each.

Every script reads the record at ``KEYS[1]`` and decides on the server.  The record is the
JSON object the TypeScript port writes (``status``, ``expiration`` in seconds,
``in_progress_expiration`` in milliseconds, ``validation``, ``data``) plus our ``owner``
and ``data_format``.  Our writer puts ``data`` last, as the TypeScript port does, so a
script reads only the part before ``,"data":`` (:lua:`head`): a large response is never
decoded on the server, and never re-encoded — the client builds the record text and the
script writes it as given, only splicing in the instants it computed by its clock.

The first occurrence of ``,"data":`` is either the top-level ``data`` member or lies
inside a nested value; a ``"`` inside a JSON string is always escaped, so it is never
inside a string.  In the nested case the cut text is unbalanced and fails to decode, and
the script decodes the whole record instead.  Powertools (Python) writes ``data`` first
(``{"data": "<JSON text>", "status": …}``), so its completed records are decoded whole;
their ``data`` is one JSON string, cheap to skip.

Steps (recovery points) ride on an in-progress record after its ``owner``:
``"step_count":n,"steps":"<the step list's JSON text>"`` — the list as *one JSON string*, so
the scripts carry it without decoding results (``cjson`` decodes the string and encodes it
again, value for value), and no result can put a top-level ``,"data":`` into the text.
``progress(rec)`` re-emits the two members, or answers nil for a damaged pair (a script
then writes nothing).  Claim keeps them when it takes over an unexpired INPROGRESS record
(lapsed, released or its own) with the claim's validation (read from the claim's tail);
extend keeps them; complete drops them; release rewrites the owner's record carrying them
as *released* (no owner, lease end ``ARGV[3]`` or ``TIME`` less 1 ms, ``KEEPTTL``); step
(``ARGV``: owner, now, ttl, position, the list) writes them.

Complete, extend and step start alike: ``owned(status)`` reads the record and answers it
when ``ARGV[1]`` (the owner token) holds it, in ``status`` when one is given, else nil (the
script answers ``0``, writing nothing).

Times: ``ARGV[2]`` is the client's clock in Unix seconds, or empty for the server's
``TIME``.  Instants follow :mod:`idempotency_async.record`: expiry ``ceil(now + max(ttl,
lease))`` in seconds, lease end ``ceil((now + lease) * 1000)`` in milliseconds.  The key
itself lives one second past the record's expiry (``PX``, a duration, so it is right
whatever clock judged).

Answers: claim ``1`` when written, else ``{state, record, now, key}`` with state 2 (in
progress), 3 (completed), 4 (a lapsed record that may be taken over once the caller holds
its ``<key>:lock``; only asked for with ``ARGV[6] == 'ask'``, see
:mod:`idempotency_async.stores.redis`), 5 (resumable: steps under another validation,
nothing written), 6 (written, keeping the record's steps: the record is the one written)
or 9 (unreadable); step ``1`` recorded (or already held), ``0`` lost; complete ``1`` written, ``0``
not the owner's record, ``2`` kept (a completion without a response, ``ARGV[5] ==
'bare'``, met the owner's record completed with one: a response is final); release
``1``/``0``; extend (a claim's arguments, fenced by the owner, never moving the lease end
back) ``1`` renewed, ``2`` already later, ``0`` lost; get ``{record or nil, now, key}``;
force release ``{deleted record or nil, key}``; release exactly ``1`` (deleted) / ``0``
(the record differs from the one described, or is gone).  ``now`` travels as text: Redis
truncates Lua numbers to integers.  Every answer that carries a record carries ``KEYS[1]``
too, so the client can tell an answer about another key (a proxy or connection that mixed
answers up) from one about its own.

Wake-ups: a completion that wrote and a release that deleted (or released) publish
``completed`` / ``released`` on the channel named like the record's Redis key
(``KEYS[1]``), in the same script and round trip, with the command the client names
(``ARGV[6]`` of complete, ``ARGV[2]`` of release: ``PUBLISH``, or empty for none).
``redis.pcall``: a server or ACL that refuses it (Redis 7 users get no channel permissions
by default) never fails the write, it only leaves waiters to their next poll.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "CLAIM",
    "COMPLETE",
    "EXTEND",
    "FORCE_RELEASE",
    "GET",
    "RELEASE",
    "RELEASE_EXACTLY",
    "STEP",
]

_COMMON: Final = r"""
local function head(raw)
  local cut = string.find(raw, ',"data":', 1, true)
  if cut then
    local ok, rec = pcall(cjson.decode, string.sub(raw, 1, cut - 1) .. '}')
    if ok and type(rec) == 'table' and rec.status ~= nil and rec.expiration ~= nil then
      return rec
    end
  end
  local ok, rec = pcall(cjson.decode, raw)
  if ok and type(rec) == 'table' then return rec end
  return nil
end
local function clock(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function text(now, given)
  if given ~= '' then return given end
  return string.format('%.6f', now)
end
local function int(n) return string.format('%.0f', n) end
local function store(key, value, expiration, now)
  redis.call('SET', key, value, 'PX', math.max(math.ceil((expiration - now) * 1000), 0) + 1000)
end
local function wake(command, what)
  if command ~= '' then redis.pcall(command, KEYS[1], what) end
end
local function stepped(rec)
  return rec.steps ~= nil or rec.step_count ~= nil
end
local function owned(status)
  local raw = redis.call('GET', KEYS[1])
  if not raw then return nil end
  local rec = head(raw)
  if rec == nil or rec.owner ~= ARGV[1] then return nil end
  if status ~= nil and rec.status ~= status then return nil end
  return rec
end
local function progress(rec)
  local steps, count = rec.steps, rec.step_count
  if type(steps) ~= 'string' or type(count) ~= 'number' or count ~= math.floor(count)
    or count < 1 or count > 64 then
    return nil
  end
  return ',"step_count":' .. int(count) .. ',"steps":' .. cjson.encode(steps)
end
"""

CLAIM: Final = (
    _COMMON
    + r"""
local now = clock(ARGV[2])
local raw = redis.call('GET', KEYS[1])
local kept = nil
if raw then
  local rec = head(raw)
  local state = 9
  local expiration = nil
  if rec ~= nil then expiration = tonumber(rec.expiration) end
  if rec == nil then
    state = 9
  elseif rec.status == 'INPROGRESS' and rec.owner == ARGV[1] then
    state = nil
  else
    if expiration ~= nil and expiration < now then
      state = nil
    elseif rec.status == 'COMPLETED' then
      state = 3
    elseif rec.status == 'INPROGRESS' then
      local lease_end = tonumber(rec.in_progress_expiration)
      if lease_end ~= nil and lease_end < now * 1000 then state = nil else state = 2 end
    end
  end
  if state == nil and stepped(rec) and (expiration == nil or expiration >= now) then
    kept = progress(rec)
    local listed = false
    if kept ~= nil then
      -- Resuming reads the list once (the only script that does): a list its count does
      -- not count, or that is not a list, is refused before anything is written.  Text
      -- this decoder refuses (a lone surrogate's escape, which the manager writes) is
      -- left to the client, which reads every list it resumes.
      local ok, list = pcall(cjson.decode, rec.steps)
      listed = not ok or (type(list) == 'table' and #list == rec.step_count)
    end
    if not listed or rec.status ~= 'INPROGRESS' then
      state = 9
    else
      local ok, mine = pcall(cjson.decode, '{' .. string.sub(ARGV[5], 2))
      if not ok or type(mine) ~= 'table' then return redis.error_reply('bad claim tail') end
      local held = rec.validation
      if held == cjson.null then held = nil end
      if held ~= mine.validation then state = 5 end
    end
  end
  if state then return {state, raw, text(now, ARGV[2]), KEYS[1]} end
  if ARGV[6] == 'ask' and rec.owner ~= ARGV[1] then
    return {4, raw, text(now, ARGV[2]), KEYS[1]}
  end
end
local lease = tonumber(ARGV[3])
local expiration = math.ceil(now + math.max(tonumber(ARGV[4]), lease))
local value = '{"status":"INPROGRESS","expiration":' .. int(expiration)
  .. ',"in_progress_expiration":' .. int(math.ceil((now + lease) * 1000))
if kept == nil then
  store(KEYS[1], value .. ARGV[5], expiration, now)
  return 1
end
value = value .. string.sub(ARGV[5], 1, -2) .. kept .. '}'
store(KEYS[1], value, expiration, now)
return {6, value, text(now, ARGV[2]), KEYS[1]}
"""
)

COMPLETE: Final = (
    _COMMON
    + r"""
local rec = owned(nil)
if rec == nil then return 0 end
if ARGV[5] == 'bare' and rec.status == 'COMPLETED' then
  local format = rec.data_format
  if type(format) ~= 'string' or string.sub(format, 1, 10) ~= 'not-stored' then return 2 end
end
local now = clock(ARGV[2])
local expiration = math.ceil(now + math.max(tonumber(ARGV[3]), 0))
store(KEYS[1], '{"status":"COMPLETED","expiration":' .. int(expiration) .. ARGV[4],
  expiration, now)
wake(ARGV[6], 'completed')
return 1
"""
)

RELEASE: Final = (
    _COMMON
    + r"""
local raw = redis.call('GET', KEYS[1])
if not raw then return 1 end
local rec = head(raw)
if rec == nil then return 0 end
if rec.owner == ARGV[1] then
  if rec.status == 'INPROGRESS' and stepped(rec) then
    local kept = progress(rec)
    if kept == nil then return 0 end
    local ended = ARGV[3]
    if ended == '' then ended = int(math.floor(clock('') * 1000) - 1) end
    local value = '{"status":"INPROGRESS"'
    local expiration = tonumber(rec.expiration)
    if expiration ~= nil then value = value .. ',"expiration":' .. int(expiration) end
    value = value .. ',"in_progress_expiration":' .. ended
    if type(rec.validation) == 'string' then
      value = value .. ',"validation":' .. cjson.encode(rec.validation)
    end
    redis.call('SET', KEYS[1], value .. kept .. '}', 'KEEPTTL')
  else
    redis.call('DEL', KEYS[1])
  end
  wake(ARGV[2], 'released')
  return 1
end
if rec.owner == nil and rec.status == 'INPROGRESS' and stepped(rec) then return 1 end
return 0
"""
)

EXTEND: Final = (
    _COMMON
    + r"""
local rec = owned('INPROGRESS')
if rec == nil then return 0 end
local now = clock(ARGV[2])
local lease = tonumber(ARGV[3])
local lease_end = math.ceil((now + lease) * 1000)
local current = tonumber(rec.in_progress_expiration)
if current ~= nil and current > lease_end then return 2 end
local expiration = math.ceil(now + math.max(tonumber(ARGV[4]), lease))
local value = '{"status":"INPROGRESS","expiration":' .. int(expiration)
  .. ',"in_progress_expiration":' .. int(lease_end)
if stepped(rec) then
  local kept = progress(rec)
  if kept == nil then return 0 end
  value = value .. string.sub(ARGV[5], 1, -2) .. kept .. '}'
else
  value = value .. ARGV[5]
end
store(KEYS[1], value, expiration, now)
return 1
"""
)

STEP: Final = (
    _COMMON
    + r"""
local rec = owned('INPROGRESS')
if rec == nil then return 0 end
local held = 0
if stepped(rec) then
  if progress(rec) == nil then return 0 end
  if rec.steps == ARGV[5] then return 1 end
  held = rec.step_count
end
if held ~= tonumber(ARGV[4]) then return 0 end
local now = clock(ARGV[2])
local expiration = math.ceil(now + tonumber(ARGV[3]))
local lease_end = tonumber(rec.in_progress_expiration)
local value = '{"status":"INPROGRESS"'
if lease_end ~= nil then
  lease_end = math.ceil(lease_end)
  expiration = math.max(expiration, math.ceil(lease_end / 1000))
end
local before = tonumber(rec.expiration)
if before ~= nil then expiration = math.max(expiration, math.ceil(before)) end
value = value .. ',"expiration":' .. int(expiration)
if lease_end ~= nil then value = value .. ',"in_progress_expiration":' .. int(lease_end) end
if type(rec.validation) == 'string' then
  value = value .. ',"validation":' .. cjson.encode(rec.validation)
end
value = value .. ',"owner":' .. cjson.encode(ARGV[1]) .. ',"step_count":' .. int(held + 1)
  .. ',"steps":' .. cjson.encode(ARGV[5]) .. '}'
local px = math.max(math.ceil((expiration - now) * 1000), 0) + 1000
redis.call('SET', KEYS[1], value, 'PX', math.max(px, redis.call('PTTL', KEYS[1])))
return 1
"""
)

GET: Final = (
    _COMMON
    + r"""
local now = clock(ARGV[1])
return {redis.call('GET', KEYS[1]), text(now, ARGV[1]), KEYS[1]}
"""
)

FORCE_RELEASE: Final = r"""
local raw = redis.call('GET', KEYS[1])
if raw then redis.call('DEL', KEYS[1]) end
return {raw, KEYS[1]}
"""

# The record as an operator saw it: owner ('' for none, after a leading '='), status,
# expiry and lease end as whole seconds / milliseconds ('' for none), rounded up as the
# client reads them, and the step list ('' for none, else after a leading '='): a release
# removes only the progress the operator was shown.
RELEASE_EXACTLY: Final = (
    _COMMON
    + r"""
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local rec = head(raw)
if rec == nil then return 0 end
local function ceiled(value)
  if value == nil then return '' end
  local n = tonumber(value)
  if n == nil then return '?' end
  return int(math.ceil(n))
end
local owner = rec.owner
if type(owner) ~= 'string' then owner = '' end
if '=' .. owner ~= ARGV[1] or rec.status ~= ARGV[2] then return 0 end
if ceiled(rec.expiration) ~= ARGV[3] or ceiled(rec.in_progress_expiration) ~= ARGV[4] then
  return 0
end
local steps = ''
if type(rec.steps) == 'string' then
  steps = '=' .. rec.steps
elseif rec.steps ~= nil then
  steps = '?'
end
if steps ~= ARGV[5] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""
)
