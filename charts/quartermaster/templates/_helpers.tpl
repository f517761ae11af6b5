{{/* Chart name, truncated to a DNS label. */}}
{{- define "quartermaster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name: release-chart, or fullnameOverride. */}}
{{- define "quartermaster.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "quartermaster.chart" -}}
{{- printf "%s-%s" .Chart.Name (.Chart.Version | replace "+" "_") | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: name + instance only; selectors are immutable after install. */}}
{{- define "quartermaster.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quartermaster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "quartermaster.labels" -}}
helm.sh/chart: {{ include "quartermaster.chart" . }}
{{ include "quartermaster.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: quartermaster
{{- end -}}

{{/* Labels and selector for one component: (dict "ctx" $ "component" "web"). */}}
{{- define "quartermaster.componentLabels" -}}
{{ include "quartermaster.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "quartermaster.componentSelector" -}}
{{ include "quartermaster.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "quartermaster.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "quartermaster.serviceAccountName" -}}
{{- default (include "quartermaster.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "quartermaster.webService" -}}
{{- printf "%s-web" (include "quartermaster.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The URL pods inside the cluster use to reach the portal (node agent, readiness check). */}}
{{- define "quartermaster.internalURL" -}}
{{- printf "http://%s.%s.svc:%d" (include "quartermaster.webService" .) .Release.Namespace (int .Values.web.service.port) -}}
{{- end -}}

{{/* ALLOWED_HOSTS: the configured hosts, the ingress hosts and the in-cluster service names. */}}
{{- define "quartermaster.allowedHosts" -}}
{{- $svc := include "quartermaster.webService" . -}}
{{- $hosts := list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) -}}
{{- range .Values.config.allowedHosts }}{{ $hosts = append $hosts . }}{{ end -}}
{{- if .Values.ingress.enabled }}{{ range .Values.ingress.hosts }}{{ $hosts = append $hosts .host }}{{ end }}{{ end -}}
{{- $hosts | uniq | join "," -}}
{{- end -}}

{{- define "quartermaster.secretName" -}}
{{- default (printf "%s-app" (include "quartermaster.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "quartermaster.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "quartermaster.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* OIDC_GROUP_MAP from config.sso.groupMap: "group:team:role,..." */}}
{{- define "quartermaster.oidcGroupMap" -}}
{{- $entries := list }}
{{- range .groupMap }}
{{- $entries = append $entries (printf "%s:%s:%s" .group .team .role) }}
{{- end }}
{{- join "," $entries }}
{{- end -}}

{{/* Environment of web, worker, beat and the migration Job: config from the ConfigMap, secrets as files. */}}
{{- define "quartermaster.appEnv" -}}
envFrom:
  - configMapRef:
      name: {{ include "quartermaster.fullname" . }}-config
env:
  - name: SECRET_KEY_FILE
    value: /run/secrets/quartermaster/SECRET_KEY
  - name: DATABASE_URL_FILE
    value: /run/secrets/quartermaster/DATABASE_URL
  - name: REDIS_URL_FILE
    value: /run/secrets/quartermaster/REDIS_URL
  - name: NODE_AGENT_TOKEN_FILE
    value: /run/secrets/quartermaster/NODE_AGENT_TOKEN
  - name: METRICS_TOKEN_FILE
    value: /run/secrets/quartermaster/METRICS_TOKEN
  {{- if .Values.config.sso.clientId }}
  - name: OIDC_RP_CLIENT_SECRET_FILE
    value: /run/secrets/quartermaster/OIDC_RP_CLIENT_SECRET
  {{- end }}
  {{- if and .Values.config.notifications.email.host .Values.config.notifications.email.user }}
  - name: EMAIL_HOST_PASSWORD_FILE
    value: /run/secrets/quartermaster/EMAIL_HOST_PASSWORD
  {{- end }}
  {{- if and .Values.config.prometheus.url .Values.config.prometheus.username }}
  - name: PROMETHEUS_PASSWORD_FILE
    value: /run/secrets/quartermaster/PROMETHEUS_PASSWORD
  {{- end }}
  # names this replica for the metrics lease (portal/metrics.py)
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  {{- range $k, $v := .Values.config.extraEnv }}
  - name: {{ $k }}
    value: {{ $v | quote }}
  {{- end }}
{{- end -}}

{{- define "quartermaster.appVolumeMounts" -}}
- name: secrets
  mountPath: /run/secrets/quartermaster
  readOnly: true
- name: var
  mountPath: /var/lib/quartermaster
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "quartermaster.appVolumes" -}}
- name: secrets
  secret:
    secretName: {{ include "quartermaster.secretName" . }}
    items:
      - {key: SECRET_KEY, path: SECRET_KEY}
      - {key: DATABASE_URL, path: DATABASE_URL}
      - {key: REDIS_URL, path: REDIS_URL}
      - {key: NODE_AGENT_TOKEN, path: NODE_AGENT_TOKEN}
      - {key: METRICS_TOKEN, path: METRICS_TOKEN}
      {{- if .Values.config.sso.clientId }}
      - {key: OIDC_RP_CLIENT_SECRET, path: OIDC_RP_CLIENT_SECRET}
      {{- end }}
      {{- if and .Values.config.notifications.email.host .Values.config.notifications.email.user }}
      - {key: EMAIL_HOST_PASSWORD, path: EMAIL_HOST_PASSWORD}
      {{- end }}
      {{- if and .Values.config.prometheus.url .Values.config.prometheus.username }}
      - {key: PROMETHEUS_PASSWORD, path: PROMETHEUS_PASSWORD}
      {{- end }}
- name: var
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- end -}}

{{/* Init container: wait until the migration Job has migrated the database. */}}
{{- define "quartermaster.waitForMigrations" -}}
- name: wait-for-migrations
  image: {{ include "quartermaster.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["sh", "-c", "until python manage.py migrate --check >/dev/null 2>&1; do echo waiting for database migrations; sleep 5; done"]
  {{- include "quartermaster.appEnv" . | nindent 2 }}
  volumeMounts:
    {{- include "quartermaster.appVolumeMounts" . | nindent 4 }}
  securityContext:
    {{- include "quartermaster.containerSecurityContext" . | nindent 4 }}
  resources:
    {{- toYaml .Values.migrations.resources | nindent 4 }}
{{- end -}}

{{- define "quartermaster.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The team namespaces: name -> namespace. */}}
{{- define "quartermaster.teamNamespaces" -}}
{{- $out := list -}}
{{- range .Values.teams }}{{ $out = append $out (default .name .namespace) }}{{ end -}}
{{- $out | uniq | join "," -}}
{{- end -}}

{{- /* topologySpreadConstraints for a component: each constraint selects the component's own
pods (selector labels), so replicas spread over nodes/zones. */}}
{{- define "quartermaster.topologySpread" -}}
{{- if .constraints }}
topologySpreadConstraints:
{{- range .constraints }}
  - maxSkew: {{ .maxSkew | default 1 }}
    topologyKey: {{ .topologyKey }}
    whenUnsatisfiable: {{ .whenUnsatisfiable | default "ScheduleAnyway" }}
    labelSelector:
      matchLabels:
        {{- include "quartermaster.componentSelector" (dict "ctx" $.ctx "component" $.component) | nindent 8 }}
{{- end }}
{{- end }}
{{- end -}}
