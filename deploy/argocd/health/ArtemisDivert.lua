-- Argo CD health of an ArtemisDivert (artemis-studio.io). Lua 5.1 as Argo CD runs it: base, table and
-- a safe os only (no string, no math). Installed through deploy/argocd/argocd-cm-patch.yaml
-- (deploy/argocd/generate). The verdicts are the README's GitOps table: tested on statuses built
-- from the operator's own types (tests/argocd_health.rs) and, with Argo CD's own runner, on live
-- objects (tests/integration/gitops.rs).
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
-- Only a person can fix it (the operator's Stalled, which Flux reads too): a missing cluster,
-- refused credentials, a refused or blocked delete, a node that refused for good.
local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = tostring(stalled.reason) .. ": " .. tostring(stalled.message)
  return hs
end
-- Paused (artemis-studio.io/paused), asked for by the user: no broker write until it goes.
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
-- What the user asked for (the operator sets neither Reconciling nor Stalled for these).
local held = {
  DryRun = true, Paused = true, DryRunDelete = true, PausedDelete = true,
  AwaitingConfirmation = true, ConfirmationMismatch = true, ConfirmedBeforeShown = true,
}
if ready ~= nil and held[ready.reason] then
  hs.status = "Suspended"
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
