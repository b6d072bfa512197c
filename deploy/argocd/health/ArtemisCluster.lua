-- Argo CD health of an ArtemisCluster (artemis-studio.io). Lua 5.1 as Argo CD runs it.
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
local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = tostring(ready.message)
  local degraded = condition("Degraded")
  if degraded ~= nil and degraded.status == "True" then
    hs.message = hs.message .. "; " .. tostring(degraded.message)
  end
  return hs
end
-- Reasons that no amount of waiting fixes: the spec, the Secret or the broker's configuration
-- must change. Unreachable brokers, no live node yet, or no pod discovered yet are Progressing.
local terminal = {
  SecretMissing = true, SecretKeyMissing = true, SecretUnreadable = true, InvalidTls = true,
  CredentialsRefused = true, OriginRefused = true, NotJolokia = true,
}
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
