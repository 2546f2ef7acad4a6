{{/*
Names, labels and the pieces shared by the worker Deployment, the drain CronJob, the
KEDA ScaledJob and the migration hook.
*/}}

{{- define "pgworker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pgworker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pgworker.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pgworker.version" -}}
{{- default .Chart.AppVersion .Values.image.tag | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Standard labels. Call with (dict "ctx" $ "component" "worker").
*/}}
{{- define "pgworker.labels" -}}
helm.sh/chart: {{ include "pgworker.chart" .ctx }}
{{ include "pgworker.selectorLabels" . }}
app.kubernetes.io/version: {{ include "pgworker.version" .ctx | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: pgworker
{{- end }}

{{- define "pgworker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pgworker.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "pgworker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pgworker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pgworker.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: longer than the shutdown grace, so that the supervisor
can release what did not finish before Kubernetes sends SIGKILL.
*/}}
{{- define "pgworker.terminationGracePeriodSeconds" -}}
{{- $grace := int .Values.worker.shutdownGraceSeconds }}
{{- $tgps := .Values.worker.terminationGracePeriodSeconds }}
{{- if kindIs "invalid" $tgps }}
{{- add $grace (int .Values.worker.terminationGraceMarginSeconds) }}
{{- else if le (int $tgps) $grace }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must be longer than worker.shutdownGraceSeconds (%d): Kubernetes would SIGKILL the worker before its running jobs are settled; leave it null to compute it" (int $tgps) $grace) }}
{{- else }}
{{- int $tgps }}
{{- end }}
{{- end }}

{{/*
activeDeadlineSeconds of a drain Job: longer than the drain deadline plus the shutdown
grace, so a run that hits its deadline can still finish its jobs and report.
*/}}
{{- define "pgworker.drainActiveDeadlineSeconds" -}}
{{- $floor := add (int .Values.cronjob.maxDurationSeconds) (int .Values.worker.shutdownGraceSeconds) }}
{{- $ads := .Values.cronjob.activeDeadlineSeconds }}
{{- if kindIs "invalid" $ads }}
{{- add $floor (int .Values.cronjob.deadlineMarginSeconds) }}
{{- else if le (int $ads) $floor }}
{{- fail (printf "cronjob.activeDeadlineSeconds (%d) must be longer than cronjob.maxDurationSeconds + worker.shutdownGraceSeconds (%d): the Job would be killed before the drain run stops by itself; leave it null to compute it" (int $ads) $floor) }}
{{- else }}
{{- int $ads }}
{{- end }}
{{- end }}

{{/*
The count KEDA polls: the work a pod must start for, or stay for, in worker.queues.
- Due, claimable jobs outside paused queues: the predicate of pgworker's claim index
  jobs_claim_idx (queue, priority DESC, run_at, id) WHERE state = 'pending' AND NOT
  blocked, with run_at <= now(), as the jobs_due_count query of drain mode counts them
  and as pgworker_queue_jobs{state="due"} exports them; jobs scheduled later
  (state="scheduled") start no pod.
- Running jobs (jobs_running_idx (queue) WHERE state = 'running'), whether their lease is
  valid or expired: with a valid lease a pod is running them, and the count must stay
  above zero so that KEDA does not scale it away mid-job after cooldownPeriod; with an
  expired lease their pod died, and only a running pgworker reaps them.
Both terms read partial indexes only: KEDA runs this every pollingInterval. Queue and
schema names are restricted by values.schema.json so that they need no quoting here.
*/}}
{{- define "pgworker.kedaQuery" -}}
{{- $jobs := printf "\"%s\".jobs" .Values.database.schema }}
{{- $queues := printf "queue = ANY('{%s}'::text[])" (join "," .Values.worker.queues) }}
{{- $paused := printf "SELECT name FROM \"%s\".queues WHERE paused_at IS NOT NULL" .Values.database.schema }}
{{- printf "SELECT (SELECT count(*) FROM %s WHERE %s AND state = 'pending' AND NOT blocked AND run_at <= now() AND queue NOT IN (%s)) + (SELECT count(*) FROM %s WHERE %s AND state = 'running')" $jobs $queues $paused $jobs $queues }}
{{- end }}

{{/*
The DSN and schema of the worker containers. A DSN only ever comes from a Secret.
*/}}
{{- define "pgworker.env" -}}
- name: PGWORKER_DSN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret | quote }}
      key: {{ .Values.database.dsnKey | quote }}
- name: PGWORKER_SCHEMA
  value: {{ .Values.database.schema | quote }}
{{- end }}

{{/*
Environment of the pods that act as the schema's owner (the migration hook, the prune
CronJob): the owner's DSN when database.ownerDsnKey is set, else the workers' DSN.
*/}}
{{- define "pgworker.ownerEnv" -}}
- name: PGWORKER_DSN
  valueFrom:
    secretKeyRef:
      name: {{ default .Values.database.existingSecret .Values.database.ownerDsnSecret | quote }}
      key: {{ default .Values.database.dsnKey .Values.database.ownerDsnKey | quote }}
- name: PGWORKER_SCHEMA
  value: {{ .Values.database.schema | quote }}
{{- end }}

{{- define "pgworker.workerEnv" -}}
{{ include "pgworker.env" . }}
{{- if .Values.database.listenDsnKey }}
- name: PGWORKER_LISTEN_DSN
  valueFrom:
    secretKeyRef:
      name: {{ default .Values.database.existingSecret .Values.database.listenDsnSecret | quote }}
      key: {{ .Values.database.listenDsnKey | quote }}
{{- end }}
{{- with .Values.worker.app }}
- name: PGWORKER_APP
  value: {{ . | quote }}
{{- end }}
{{- with .Values.worker.queues }}
- name: PGWORKER_QUEUES
  value: {{ join "," . | quote }}
{{- end }}
{{- if not (kindIs "invalid" .Values.worker.concurrency) }}
- name: PGWORKER_CONCURRENCY
  value: {{ .Values.worker.concurrency | int | toString | quote }}
{{- end }}
- name: PGWORKER_SHUTDOWN_GRACE_SECONDS
  value: {{ .Values.worker.shutdownGraceSeconds | int | toString | quote }}
- name: PGWORKER_METRICS_PORT
  value: {{ .Values.worker.metricsPort | int | toString | quote }}
- name: PGWORKER_STATS
  value: {{ .Values.worker.stats | toString | quote }}
{{- with .Values.worker.retention }}
- name: PGWORKER_PRUNE
  value: {{ .enabled | toString | quote }}
- name: PGWORKER_PRUNE_INTERVAL_SECONDS
  value: {{ .intervalSeconds | toString | quote }}
- name: PGWORKER_RETENTION_SUCCEEDED_SECONDS
  value: {{ if kindIs "invalid" .succeededSeconds }}"off"{{ else }}{{ .succeededSeconds | toString | quote }}{{ end }}
- name: PGWORKER_RETENTION_CANCELLED_SECONDS
  value: {{ if kindIs "invalid" .cancelledSeconds }}"off"{{ else }}{{ .cancelledSeconds | toString | quote }}{{ end }}
- name: PGWORKER_RETENTION_DEAD_SECONDS
  value: {{ if kindIs "invalid" .deadSeconds }}"off"{{ else }}{{ .deadSeconds | toString | quote }}{{ end }}
- name: PGWORKER_RETENTION_QUEUE_EVENTS_SECONDS
  value: {{ if kindIs "invalid" .queueEventsSeconds }}"off"{{ else }}{{ .queueEventsSeconds | toString | quote }}{{ end }}
{{- end }}
- name: PGWORKER_LOG_FORMAT
  value: {{ .Values.worker.logFormat | quote }}
- name: PGWORKER_LOG_LEVEL
  value: {{ .Values.worker.logLevel | quote }}
- name: PROMETHEUS_MULTIPROC_DIR
  value: {{ .Values.worker.multiprocDir | quote }}
{{- with .Values.otel }}
{{- if .endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ .protocol | quote }}
- name: OTEL_TRACES_EXPORTER
  value: otlp
- name: OTEL_SERVICE_NAME
  value: {{ default (include "pgworker.fullname" $) .serviceName | quote }}
{{- with .resourceAttributes }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ . | quote }}
{{- end }}
{{- with .tracesSampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with .tracesSamplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The worker pod spec. Call with (dict "ctx" $ "args" (list ...) "drain" true|false).
*/}}
{{- define "pgworker.workerPodSpec" -}}
{{- $ctx := .ctx }}
{{- with $ctx.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
serviceAccountName: {{ include "pgworker.serviceAccountName" $ctx }}
automountServiceAccountToken: {{ $ctx.Values.serviceAccount.automountServiceAccountToken }}
{{- with $ctx.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml $ctx.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ include "pgworker.terminationGracePeriodSeconds" $ctx }}
{{- if .drain }}
restartPolicy: Never
{{- end }}
containers:
  - name: worker
    image: {{ include "pgworker.image" $ctx | quote }}
    imagePullPolicy: {{ $ctx.Values.image.pullPolicy }}
    args:
      {{- toYaml .args | nindent 6 }}
    env:
      {{- include "pgworker.workerEnv" $ctx | nindent 6 }}
    {{- with $ctx.Values.extraEnvFrom }}
    envFrom:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- if not .drain }}
    ports:
      - name: metrics
        containerPort: {{ $ctx.Values.worker.metricsPort }}
        protocol: TCP
    {{- with $ctx.Values.deployment.livenessProbe }}
    livenessProbe:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $ctx.Values.deployment.readinessProbe }}
    readinessProbe:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- end }}
    resources:
      {{- toYaml $ctx.Values.resources | nindent 6 }}
    securityContext:
      {{- toYaml $ctx.Values.securityContext | nindent 6 }}
    volumeMounts:
      - name: prometheus-multiproc
        mountPath: {{ $ctx.Values.worker.multiprocDir }}
      - name: tmp
        mountPath: /tmp
volumes:
  # prometheus_client multiprocess files (the root filesystem is read-only)
  - name: prometheus-multiproc
    emptyDir:
      medium: Memory
      sizeLimit: 64Mi
  - name: tmp
    emptyDir:
      sizeLimit: 256Mi
{{- with $ctx.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $ctx.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $ctx.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $ctx.Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Arguments of a drain run: `pgworker run --drain --max-duration <S>s [--pushgateway-url URL]`.
*/}}
{{- define "pgworker.drainArgs" -}}
{{- $args := list "run" "--drain" "--max-duration" (printf "%ds" (int .Values.cronjob.maxDurationSeconds)) }}
{{- with .Values.cronjob.pushgatewayUrl }}
{{- $args = concat $args (list "--pushgateway-url" .) }}
{{- end }}
{{- toYaml (concat $args .Values.worker.extraArgs) }}
{{- end }}

{{/*
podFailurePolicy of drain Jobs: exit 75 (deadline passed with due work left) fails the
Job at once instead of retrying right away: the next scheduled run continues the work,
and back-to-back retries would keep a suspending compute awake. Evictions and other
disruptions do not count against backoffLimit.
*/}}
{{- define "pgworker.drainPodFailurePolicy" -}}
rules:
  - action: FailJob
    onExitCodes:
      containerName: worker
      operator: In
      values: [75]
  - action: Ignore
    onPodConditions:
      - type: DisruptionTarget
        status: "True"
{{- end }}

{{/*
Checks of value combinations that values.schema.json cannot express.
*/}}
{{- define "pgworker.validate" -}}
{{- $v := .Values }}
{{- if and $v.keda.scaledObject.enabled (ne $v.mode "deployment") }}
{{- fail "keda.scaledObject.enabled scales the worker Deployment: it needs mode: deployment (for drain runs on demand use keda.scaledJob with mode: cronjob)" }}
{{- end }}
{{- if and $v.keda.scaledJob.enabled (ne $v.mode "cronjob") }}
{{- fail "keda.scaledJob.enabled starts drain runs on demand: it needs mode: cronjob (it replaces the CronJob's schedule)" }}
{{- end }}
{{- if and (or $v.keda.scaledObject.enabled $v.keda.scaledJob.enabled) (not $v.worker.queues) }}
{{- fail "KEDA's trigger query lists the queues: set worker.queues" }}
{{- end }}
{{- if and (or $v.serviceMonitor.enabled $v.podMonitor.enabled) (ne $v.mode "deployment") }}
{{- fail "serviceMonitor/podMonitor need mode: deployment: drain runs serve no /metrics; they push a summary to cronjob.pushgatewayUrl" }}
{{- end }}
{{- if and $v.serviceMonitor.enabled (not $v.service.enabled) }}
{{- fail "serviceMonitor.enabled needs service.enabled (or use podMonitor)" }}
{{- end }}
{{- if and $v.prometheusRule.enabled (eq $v.mode "cronjob") (not $v.cronjob.pushgatewayUrl) }}
{{- fail "prometheusRule in mode: cronjob alerts on the drain summaries pushed to a Pushgateway: set cronjob.pushgatewayUrl" }}
{{- end }}
{{- $_ := include "pgworker.terminationGracePeriodSeconds" . }}
{{- if eq $v.mode "cronjob" }}
{{- $_ := include "pgworker.drainActiveDeadlineSeconds" . }}
{{- end }}
{{- end }}
