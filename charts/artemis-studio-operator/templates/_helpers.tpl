{{/*
Every object is named after the release, so two releases in one cluster never collide
(ClusterRoles included). Install with the release name `artemis-studio` to get the role names
the README uses.
*/}}

{{/* Labels on every object. */}}
{{- define "artemis-studio-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: artemis-studio-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: artemis-studio
{{- end }}

{{/* The operator pods: Deployment selector, Service and PodDisruptionBudget. */}}
{{- define "artemis-studio-operator.selectorLabels" -}}
app.kubernetes.io/name: artemis-studio-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The trial Postgres pod (trialPostgres.enabled). */}}
{{- define "artemis-studio-operator.trialPostgresSelectorLabels" -}}
app.kubernetes.io/name: artemis-studio-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: trial-postgres
{{- end }}

{{- define "artemis-studio-operator.serviceAccountName" -}}
{{- default .Release.Name .Values.serviceAccount.name }}
{{- end }}

{{- define "artemis-studio-operator.trialPostgresName" -}}
{{- printf "%s-trial-postgres" .Release.Name }}
{{- end }}
