-- Argo CD health of a MessageReplay (artemis-studio.io). Lua 5.1 as Argo CD runs it: base,
-- table and a safe os only (no string, no math). Installed through
-- deploy/argocd/argocd-cm-patch.yaml (deploy/argocd/generate); the verdicts are the README's GitOps
-- table (tests/argocd_health.rs).
local hs = {}
if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator's first status"
  return hs
end
local phase = obj.status.phase
-- Finished is final: a replay is never retried (issue 48; the close's one-shot rules,
-- ADR-0057 D5).
if phase == "Completed" then
  hs.status = "Healthy"
  hs.message = tostring(obj.status.message or "")
  return hs
end
if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = tostring(obj.status.message or "")
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and (obj.status.observedGeneration == nil or obj.status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
-- Only a person can fix it (the operator's Stalled, which Flux reads too): a replay that cannot
-- start, its cluster missing or its credentials refused.
for _, c in ipairs(obj.status.conditions or {}) do
  if c.type == "Stalled" and c.status == "True" then
    hs.status = "Degraded"
    hs.message = tostring(c.reason) .. ": " .. tostring(c.message)
    return hs
  end
end
-- Waits for a person: spec.confirm must name the address status.preview shows, given after the
-- preview was shown.
if phase == "AwaitingConfirmation" then
  hs.status = "Suspended"
  hs.message = tostring(obj.status.message or "")
  return hs
end
hs.status = "Progressing"
hs.message = tostring(phase) .. ": " .. tostring(obj.status.message or "")
return hs
