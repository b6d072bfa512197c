-- Argo CD health of an ArtemisDivert (artemis-studio.io). Lua 5.1 as Argo CD runs it.
-- Installed through deploy/argocd/argocd-cm-patch.yaml (deploy/argocd/generate); the verdicts
-- are tested on statuses built from the operator's own types (tests/argocd_health.rs).
local hs = {}
local function condition(t)
  for _, c in ipairs(obj.status.conditions or {}) do
    if c.type == t then return c end
  end
  return nil
end
if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator's first status"
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and (obj.status.observedGeneration == nil or obj.status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
-- A delete the operator refuses (consumers, bulk cap, a node not live): needs a person.
local blocked = condition("DeleteBlocked")
if blocked ~= nil and blocked.status == "True" then
  hs.status = "Degraded"
  hs.message = "Delete blocked (" .. tostring(blocked.reason) .. "): " .. tostring(blocked.message)
  return hs
end
for _, n in ipairs(obj.status.nodes or {}) do
  if n.outcome == "FAILED" then
    hs.status = "Degraded"
    hs.message = "Node " .. tostring(n.node) .. " FAILED: " .. tostring(n.message)
    return hs
  end
end
local paused = condition("Paused")
if paused ~= nil and paused.status == "True" then
  hs.status = "Suspended"
  hs.message = tostring(paused.message)
  return hs
end
local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = tostring(ready.message)
  return hs
end
if ready ~= nil and ready.reason == "DryRun" then
  hs.status = "Suspended"
  hs.message = tostring(ready.message)
  return hs
end
-- Reasons that no amount of waiting fixes: another object owns the divert.
local terminal = { ResourceConflict = true }
if ready ~= nil and terminal[ready.reason] then
  hs.status = "Degraded"
  hs.message = tostring(ready.reason) .. ": " .. tostring(ready.message)
  return hs
end
hs.status = "Progressing"
if ready ~= nil then
  hs.message = tostring(ready.reason) .. ": " .. tostring(ready.message)
else
  hs.message = "Waiting for the Ready condition"
end
return hs
