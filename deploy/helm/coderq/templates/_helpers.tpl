{{/*
Names, labels, the checks that refuse a release that could not work, and
the environment the worker and the migration Job share.
*/}}

{{- define "coderq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "coderq.fullname" -}}
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

{{- define "coderq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "coderq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The worker pods, as every selector of the chart picks them. */}}
{{- define "coderq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "coderq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "coderq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "coderq.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "coderq.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* CODERQ_QUEUES: the queue names joined with commas. */}}
{{- define "coderq.queues" -}}
{{- join "," .Values.worker.queues }}
{{- end }}

{{/* Jobs per pod for the autoscaler: the value given, else the slots. */}}
{{- define "coderq.perPod" -}}
{{- $given := index . 0 }}
{{- $slots := index . 1 }}
{{- if $given }}{{ $given | toString }}{{ else }}{{ $slots | toString }}{{ end }}
{{- end }}

{{/* CODERQ_SANDBOX_UIDS for local kernels. */}}
{{- define "coderq.sandboxUids" -}}
{{- if .Values.sandbox.uids }}
{{- .Values.sandbox.uids }}
{{- else if eq .Values.sandbox.securityMode "userns" }}
{{- "60000-60999" }}
{{- else }}
{{- "auto" }}
{{- end }}
{{- end }}

{{/*
The autoscaler's query: files/queue-depth.sql without its comments, on
one line, the queues in place of the marker. The names were checked
against the jobs table's own pattern, so none can end the literal.
*/}}
{{- define "coderq.queueDepthQuery" -}}
{{- $lines := list }}
{{- range splitList "\n" (.Files.Get "files/queue-depth.sql") }}
{{- if and (trim .) (not (hasPrefix "--" (trim .))) }}
{{- $lines = append $lines (trim .) }}
{{- end }}
{{- end }}
{{- join " " $lines | replace "@QUEUES@" (include "coderq.queues" .) }}
{{- end }}

{{/*
Refuse values that render a release that cannot work; each message says
what to change. Included by every template that depends on them.
*/}}
{{- define "coderq.validate" -}}
{{- $w := .Values.worker }}
{{- if le (int $w.terminationGracePeriodSeconds) (int $w.drainSeconds) }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%d) must be above worker.drainSeconds (%d): the kubelet would kill a draining worker before its jobs are released" (int $w.terminationGracePeriodSeconds) (int $w.drainSeconds)) }}
{{- end }}
{{- if not .Values.postgresql.existingSecret }}
{{- fail "postgresql.existingSecret must name the Secret holding the PostgreSQL DSN" }}
{{- end }}
{{- if not $w.queues }}
{{- fail "worker.queues must name at least one queue" }}
{{- end }}
{{- range $w.queues }}
{{- if not (regexMatch "^[a-z0-9._-]{1,64}$" (toString .)) }}
{{- fail (printf "worker.queues: %q is not a queue name (1-64 of a-z, 0-9, '.', '_', '-')" (toString .)) }}
{{- end }}
{{- end }}
{{- if and (eq .Values.backend "e2b") (not .Values.e2b.existingSecret) }}
{{- fail "backend e2b needs e2b.existingSecret, the Secret holding E2B_API_KEY" }}
{{- end }}
{{- $partitions := int .Values.kafka.jobsTopicPartitions }}
{{- if .Values.autoscaling.enabled }}
{{- $a := .Values.autoscaling }}
{{- if gt (int $a.maxReplicaCount) $partitions }}
{{- fail (printf "autoscaling.maxReplicaCount (%d) exceeds kafka.jobsTopicPartitions (%d): a worker without a partition of the jobs topic is never ready" (int $a.maxReplicaCount) $partitions) }}
{{- end }}
{{- if gt (int $a.minReplicaCount) (int $a.maxReplicaCount) }}
{{- fail (printf "autoscaling.minReplicaCount (%d) exceeds autoscaling.maxReplicaCount (%d)" (int $a.minReplicaCount) (int $a.maxReplicaCount)) }}
{{- end }}
{{- if and (eq $a.trigger "postgresql") (lt (int $a.minReplicaCount) 1) }}
{{- fail "autoscaling.minReplicaCount must be at least 1 with the postgresql trigger: with no worker no intake moves jobs from Kafka into PostgreSQL, so the queue it reads would never grow (use trigger kafka to scale from zero)" }}
{{- end }}
{{- else if gt (int $w.replicas) $partitions }}
{{- fail (printf "worker.replicas (%d) exceeds kafka.jobsTopicPartitions (%d): a worker without a partition of the jobs topic is never ready" (int $w.replicas) $partitions) }}
{{- end }}
{{- if and (hasPrefix "SASL" .Values.kafka.securityProtocol) (not .Values.kafka.sasl.existingSecret) }}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.existingSecret and kafka.sasl.mechanism" .Values.kafka.securityProtocol) }}
{{- end }}
{{- $own := include "coderq.ownEnvNames" . | fromYamlArray }}
{{- range $name, $_ := .Values.kafka.properties }}
{{- if not (regexMatch "^[a-z0-9]+(\\.[a-z0-9]+)*$" $name) }}
{{- fail (printf "kafka.properties: %q cannot be a variable name (only a-z, 0-9 and single dots); set it in a file named by CODERQ_KAFKA_PROPERTIES" $name) }}
{{- end }}
{{- if or (contains "password" $name) (contains "secret" $name) (has $name (list "ssl.key.pem" "ssl.keystore.key" "sasl.jaas.config" "sasl.oauthbearer.config")) }}
{{- fail (printf "kafka.properties: %s looks secret; values are stored in the release, so mount it from a Secret (worker.extraEnv with secretKeyRef)" $name) }}
{{- end }}
{{- if has (printf "CODERQ_KAFKA_PROP_%s" ($name | upper | replace "." "_")) $own }}
{{- fail (printf "kafka.properties: %s is set by the chart from kafka.securityProtocol, kafka.sasl or kafka.tls" $name) }}
{{- end }}
{{- end }}
{{- range $name, $_ := $w.env }}
{{- if has $name $own }}
{{- fail (printf "worker.env: %s is set by the chart from its own value (see values.yaml)" $name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The variables the chart sets itself, which worker.env may not. */}}
{{- define "coderq.ownEnvNames" -}}
- CODERQ_PG_DSN
- CODERQ_KAFKA_BROKERS
- CODERQ_KAFKA_GROUP
- CODERQ_KAFKA_PROP_SECURITY_PROTOCOL
- CODERQ_KAFKA_PROP_SASL_MECHANISM
- CODERQ_KAFKA_PROP_SASL_USERNAME
- CODERQ_KAFKA_PROP_SASL_PASSWORD
- CODERQ_KAFKA_PROP_SSL_CA_LOCATION
- CODERQ_TOPIC_JOBS
- CODERQ_TOPIC_DLQ
- CODERQ_TOPIC_RESULTS
- CODERQ_TOPIC_EVENTS
- CODERQ_LOG_LEVEL
- CODERQ_METRICS_ADDR
- CODERQ_SLOTS
- CODERQ_QUEUES
- CODERQ_DRAIN_S
- CODERQ_BACKEND
- CODERQ_LLM_PROVIDER
- CODERQ_LLM_BASE_URL
- CODERQ_LLM_MODEL
- CODERQ_LLM_API_KEY
- OPENAI_API_KEY
- CODERQ_LLM_ANTHROPIC_API_KEY
- ANTHROPIC_API_KEY
- E2B_API_KEY
- E2B_DOMAIN
- CODERQ_E2B_TEMPLATE
- CODERQ_SANDBOX
- CODERQ_SANDBOX_UIDS
- CODERQ_KERNEL_SERVER
- CODERQ_WORK_ROOT
- CODERQ_WORKER_ID
{{- end }}

{{/* CODERQ_PG_DSN from its Secret: the worker's and the migration's. */}}
{{- define "coderq.pgEnv" -}}
- name: CODERQ_PG_DSN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.postgresql.existingSecret }}
      key: {{ .Values.postgresql.dsnKey }}
{{- end }}

{{/* Kafka's client settings: brokers, security, SASL from its Secret. */}}
{{- define "coderq.kafkaEnv" -}}
{{- $k := .Values.kafka -}}
- name: CODERQ_KAFKA_BROKERS
  value: {{ $k.brokers | quote }}
- name: CODERQ_KAFKA_GROUP
  value: {{ $k.group | quote }}
- name: CODERQ_TOPIC_JOBS
  value: {{ $k.topics.jobs | quote }}
- name: CODERQ_TOPIC_DLQ
  value: {{ $k.topics.dlq | quote }}
- name: CODERQ_TOPIC_RESULTS
  value: {{ $k.topics.results | quote }}
- name: CODERQ_TOPIC_EVENTS
  value: {{ $k.topics.events | quote }}
- name: CODERQ_KAFKA_PROP_SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
{{- if hasPrefix "SASL" $k.securityProtocol }}
- name: CODERQ_KAFKA_PROP_SASL_MECHANISM
  value: {{ $k.sasl.mechanism | quote }}
- name: CODERQ_KAFKA_PROP_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $k.sasl.existingSecret }}
      key: {{ $k.sasl.usernameKey }}
- name: CODERQ_KAFKA_PROP_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $k.sasl.existingSecret }}
      key: {{ $k.sasl.passwordKey }}
{{- end }}
{{- if $k.tls.caSecret }}
- name: CODERQ_KAFKA_PROP_SSL_CA_LOCATION
  value: /etc/coderq/kafka-ca/{{ $k.tls.caKey }}
{{- end }}
{{- range $name, $value := $k.properties }}
- name: {{ printf "CODERQ_KAFKA_PROP_%s" ($name | upper | replace "." "_") }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/* The PostgreSQL CA's volume and mount, when postgresql.caSecret is set. */}}
{{- define "coderq.pgCaVolume" -}}
{{- if .Values.postgresql.caSecret -}}
- name: pg-ca
  secret:
    secretName: {{ .Values.postgresql.caSecret }}
    items:
      - key: {{ .Values.postgresql.caKey }}
        path: {{ .Values.postgresql.caKey }}
{{- end }}
{{- end }}

{{- define "coderq.pgCaMount" -}}
{{- if .Values.postgresql.caSecret -}}
- name: pg-ca
  mountPath: /etc/coderq/pg-ca
  readOnly: true
{{- end }}
{{- end }}
